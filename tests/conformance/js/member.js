'use strict'
/*
 * One KafkaJS group member (or a KafkaJS admin), run as a child process by
 * tests/conformance/test_kafkajs.py.
 *
 *     node member.js '<json config>'
 *
 * Config keys: mode ("consumer" | "admin"), bootstrap ("host:port", or several comma-separated), name
 * (client id), and for a consumer:
 * group, topics, session_ms, heartbeat_ms, rebalance_ms.
 *
 * It prints JSON lines on stdout (the same shapes as ../member.py, so the Python harness can judge
 * the group):
 *
 *   {"ev": "start", "t": ..., "client": "kafkajs", "version": "2.2.4", "pid": ...}
 *   {"ev": "state", "t": ..., "partitions": [[topic, p], ...], "generation": g, "member_id": "...",
 *    "leader_id": "...", "is_leader": bool, "protocol": "RoundRobinAssigner"}
 *        on every GROUP_JOIN instrumentation event (KafkaJS's payload has no generation: it is
 *        read from the consumer group object, the only place it lives)
 *   {"ev": "log", "level": "WARN"|"ERROR", "namespace": ..., "message": ..., "extra": {...}}
 *        everything KafkaJS logs at WARN or above (the test fails on unexpected ones)
 *   {"ev": "crash", "error": ...}               the CRASH instrumentation event
 *   {"ev": "fetch", "n": count}                 after the 1st and every 10th Fetch round trip
 *   {"ev": "reply", "id": n, "ok": true, "result": ...} | {"ev": "reply", "id": n, "ok": false,
 *    "error": {"name", "type", "message"}}      one per command read from stdin
 *   {"ev": "closed", "t": ...}
 *
 * Commands, one JSON object per stdin line, answered in order:
 *   consumer: {"id": n, "op": "commit", "offsets": [{"topic", "partition", "offset"}]}
 *   admin:    {"id": n, "op": "listGroups"|"describeGroups"|"deleteGroups"|"fetchOffsets",
 *              "args": ...}   (the KafkaJS admin method's argument)
 *
 * SIGTERM/SIGINT disconnect cleanly (the consumer sends LeaveGroup) and exit 0. The process also
 * exits (code 3) when stdin is closed, so no orphan outlives a test run.
 */

const { Kafka, logLevel, AssignerProtocol } = require('kafkajs')
const ConsumerGroup = require('kafkajs/src/consumer/consumerGroup')
const { version } = require('kafkajs/package.json')

const cfg = JSON.parse(process.argv[2])
// CLOCK_MONOTONIC in seconds, comparable with Python's time.monotonic() on Linux.
const monotonic = () => Number(process.hrtime.bigint()) / 1e9

function emit(ev, fields = {}) {
  process.stdout.write(JSON.stringify({ ev, t: monotonic(), ...fields }) + '\n')
}

// The generation of the last join: KafkaJS keeps it on the ConsumerGroup object only.
let currentGroup = null
const joinAndSync = ConsumerGroup.prototype.joinAndSync
ConsumerGroup.prototype.joinAndSync = function (...args) {
  currentGroup = this
  return joinAndSync.apply(this, args)
}

const LEVELS = { [logLevel.ERROR]: 'ERROR', [logLevel.WARN]: 'WARN', [logLevel.INFO]: 'INFO',
  [logLevel.DEBUG]: 'DEBUG' }
// HERD_TEST_KAFKAJS_DEBUG=1 (when investigating): also log INFO and DEBUG, to stderr.
const DEBUG = Boolean(process.env.HERD_TEST_KAFKAJS_DEBUG)
const logCreator = () => ({ namespace, level, log }) => {
  const { message, timestamp, logger, ...extra } = log
  const fields = { level: LEVELS[level] || String(level), namespace, message, extra }
  if (level <= logLevel.WARN) emit('log', fields)
  else process.stderr.write(JSON.stringify({ ev: 'log', t: monotonic(), ...fields }) + '\n')
}

const kafka = new Kafka({
  clientId: cfg.name,
  brokers: cfg.bootstrap.split(","),  // "h:p" or a comma-separated list (a cluster)
  logLevel: DEBUG ? logLevel.DEBUG : logLevel.WARN,
  logCreator,
  connectionTimeout: 3000,
  requestTimeout: 10000,
  retry: { initialRetryTime: 100, retries: 8 },
})

function errorInfo(e) {
  const info = { name: e && e.name, type: e && e.type, message: e && e.message }
  if (e && Array.isArray(e.groups)) { // KafkaJSDeleteGroupsError
    info.groups = e.groups.map(g => ({ groupId: g.groupId, errorCode: g.errorCode,
      type: g.error && g.error.type }))
  }
  return info
}

// DescribeGroups members carry the embedded consumer protocol bytes: decode them for the test.
function decodeMembers(result) {
  for (const group of result.groups) {
    for (const m of group.members) {
      m.memberMetadata = m.memberMetadata.length
        ? AssignerProtocol.MemberMetadata.decode(m.memberMetadata) : null
      if (m.memberMetadata && m.memberMetadata.userData) {
        m.memberMetadata.userData = m.memberMetadata.userData.toString('hex')
      }
      m.memberAssignment = m.memberAssignment.length
        ? AssignerProtocol.MemberAssignment.decode(m.memberAssignment) : null
      if (m.memberAssignment && m.memberAssignment.userData) {
        m.memberAssignment.userData = m.memberAssignment.userData.toString('hex')
      }
    }
  }
  return result
}

function serve(handlers) {
  let buffer = ''
  let chain = Promise.resolve()
  process.stdin.setEncoding('utf8')
  process.stdin.on('data', chunk => {
    buffer += chunk
    let nl
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).trim()
      buffer = buffer.slice(nl + 1)
      if (!line) continue
      const cmd = JSON.parse(line)
      chain = chain.then(async () => {
        try {
          const handler = handlers[cmd.op]
          if (!handler) throw new Error(`unknown op ${cmd.op}`)
          emit('reply', { id: cmd.id, ok: true, result: await handler(cmd) })
        } catch (e) {
          emit('reply', { id: cmd.id, ok: false, error: errorInfo(e) })
        }
      })
    }
  })
  process.stdin.on('end', () => process.exit(3)) // the parent is gone
}

function onSignals(stop) {
  let stopping = false
  const handler = () => {
    if (stopping) return
    stopping = true
    stop().then(
      () => { emit('closed'); process.exit(0) },
      e => { emit('closed', { error: errorInfo(e) }); process.exit(1) })
  }
  process.on('SIGTERM', handler)
  process.on('SIGINT', handler)
}

async function runConsumer() {
  const consumer = kafka.consumer({
    groupId: cfg.group,
    sessionTimeout: cfg.session_ms,
    heartbeatInterval: cfg.heartbeat_ms,
    rebalanceTimeout: cfg.rebalance_ms,
    maxWaitTimeInMs: 100,
  })
  const { GROUP_JOIN, CRASH } = consumer.events
  consumer.on(GROUP_JOIN, ({ payload }) => {
    const partitions = []
    for (const [topic, ps] of Object.entries(payload.memberAssignment)) {
      for (const p of ps) partitions.push([topic, p])
    }
    partitions.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] - b[1]))
    emit('state', {
      partitions,
      generation: currentGroup ? currentGroup.generationId : null,
      member_id: payload.memberId,
      leader_id: payload.leaderId,
      is_leader: payload.isLeader,
      protocol: payload.groupProtocol,
    })
  })
  consumer.on(CRASH, ({ payload }) => emit('crash', { error: errorInfo(payload.error) }))
  let fetches = 0 // the consume loop is alive: report the 1st Fetch round trip and every 10th
  consumer.on(consumer.events.FETCH, () => {
    fetches += 1
    if (fetches === 1 || fetches % 10 === 0) emit('fetch', { n: fetches })
  })
  onSignals(() => consumer.disconnect())
  serve({
    commit: async cmd => {
      await consumer.commitOffsets(cmd.offsets)
      return null
    },
  })
  await consumer.connect()
  for (const topic of cfg.topics) await consumer.subscribe({ topic, fromBeginning: true })
  emit('start', { client: 'kafkajs', version, pid: process.pid })
  await consumer.run({ autoCommit: false, eachMessage: async () => {} })
}

async function runAdmin() {
  const admin = kafka.admin()
  onSignals(() => admin.disconnect())
  serve({
    listGroups: () => admin.listGroups(),
    describeGroups: async cmd => decodeMembers(await admin.describeGroups(cmd.args)),
    deleteGroups: cmd => admin.deleteGroups(cmd.args),
    fetchOffsets: cmd => admin.fetchOffsets(cmd.args),
  })
  await admin.connect()
  emit('start', { client: 'kafkajs-admin', version, pid: process.pid })
}

;(cfg.mode === 'admin' ? runAdmin : runConsumer)().catch(e => {
  emit('fatal', { error: errorInfo(e), stack: e && e.stack })
  process.exit(2)
})
