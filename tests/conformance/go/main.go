// A franz-go group member driven by herd's conformance tests (pytest -m reference).
//
//	go run . '<json config>'
//
// Config: bootstrap, group, topics, name, assignor ("range" | "roundrobin" | "sticky" |
// "cooperative-sticky"; default franz-go's own: cooperative-sticky), instance_id, session_ms,
// heartbeat_ms, max_poll_ms. It prints the same JSON lines as tests/conformance/member.py:
//
//	{"ev": "start"} then {"ev": "assigned"|"revoked"|"lost", "partitions": [[topic, p], ...]}
//	{"ev": "state", "partitions": [...], "generation": g, "member_id": "..."}
//	{"ev": "committed", "error": ""} / {"ev": "fetched", "offsets": [[topic, p, offset, metadata], ...]}
//	{"ev": "closed"}
//
// Commands on stdin, one JSON object a line: {"cmd": "commit", "offsets": [[topic, p, offset]]},
// {"cmd": "fetch"}, {"cmd": "close"}. SIGTERM closes the client (a dynamic member leaves the
// group); stdin closing (the test process died) exits at once.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

type config struct {
	Bootstrap   string   `json:"bootstrap"`
	Group       string   `json:"group"`
	Topics      []string `json:"topics"`
	Name        string   `json:"name"`
	Assignor    string   `json:"assignor"`
	InstanceID  string   `json:"instance_id"`
	SessionMs   int      `json:"session_ms"`
	HeartbeatMs int      `json:"heartbeat_ms"`
	MaxPollMs   int      `json:"max_poll_ms"`
}

var outMu sync.Mutex

func emit(ev string, fields map[string]any) {
	if fields == nil {
		fields = map[string]any{}
	}
	fields["ev"] = ev
	fields["t"] = float64(time.Now().UnixNano()) / 1e9
	b, _ := json.Marshal(fields)
	outMu.Lock()
	os.Stdout.Write(append(b, '\n'))
	outMu.Unlock()
}

func tps(m map[string][]int32) [][]any {
	out := [][]any{}
	for t, ps := range m {
		for _, p := range ps {
			out = append(out, []any{t, p})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0].(string) != out[j][0].(string) {
			return out[i][0].(string) < out[j][0].(string)
		}
		return out[i][1].(int32) < out[j][1].(int32)
	})
	return out
}

type owned struct {
	mu sync.Mutex
	m  map[string]map[int32]bool
}

func (o *owned) apply(add bool, ps map[string][]int32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for t, list := range ps {
		if o.m[t] == nil {
			o.m[t] = map[int32]bool{}
		}
		for _, p := range list {
			if add {
				o.m[t][p] = true
			} else {
				delete(o.m[t], p)
			}
		}
	}
}

func (o *owned) snapshot() map[string][]int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]int32{}
	for t, ps := range o.m {
		for p := range ps {
			out[t] = append(out[t], p)
		}
	}
	return out
}

func main() {
	var cfg config
	if err := json.Unmarshal([]byte(os.Args[1]), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad config:", err)
		os.Exit(2)
	}
	own := &owned{m: map[string]map[int32]bool{}}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Bootstrap),
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.ClientID("franz-go-" + cfg.Name),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			own.apply(true, ps)
			emit("assigned", map[string]any{"partitions": tps(ps)})
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			own.apply(false, ps)
			emit("revoked", map[string]any{"partitions": tps(ps)})
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, ps map[string][]int32) {
			own.apply(false, ps)
			emit("lost", map[string]any{"partitions": tps(ps)})
		}),
	}
	if cfg.SessionMs > 0 {
		opts = append(opts, kgo.SessionTimeout(time.Duration(cfg.SessionMs)*time.Millisecond))
	}
	if cfg.HeartbeatMs > 0 {
		opts = append(opts, kgo.HeartbeatInterval(time.Duration(cfg.HeartbeatMs)*time.Millisecond))
	}
	if cfg.MaxPollMs > 0 {
		opts = append(opts, kgo.RebalanceTimeout(time.Duration(cfg.MaxPollMs)*time.Millisecond))
	}
	if cfg.InstanceID != "" {
		opts = append(opts, kgo.InstanceID(cfg.InstanceID))
	}
	switch cfg.Assignor {
	case "":
	case "range":
		opts = append(opts, kgo.Balancers(kgo.RangeBalancer()))
	case "roundrobin":
		opts = append(opts, kgo.Balancers(kgo.RoundRobinBalancer()))
	case "sticky":
		opts = append(opts, kgo.Balancers(kgo.StickyBalancer()))
	case "cooperative-sticky":
		opts = append(opts, kgo.Balancers(kgo.CooperativeStickyBalancer()))
	default:
		fmt.Fprintln(os.Stderr, "unknown assignor", cfg.Assignor)
		os.Exit(2)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	emit("start", map[string]any{"client": "franz-go", "name": cfg.Name})

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The poll loop: herd answers Fetch as for an empty log, so this only keeps the group going.
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachError(func(t string, p int32, err error) {
				if ctx.Err() == nil {
					fmt.Fprintf(os.Stderr, "fetch %s/%d: %v\n", t, p, err)
				}
			})
		}
	}()
	// State reports: the full assignment, the generation and the member id whenever one changes.
	go func() {
		last := ""
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			memberID, gen := cl.GroupMetadata()
			ps := tps(own.snapshot())
			key, _ := json.Marshal([]any{ps, gen, memberID})
			if string(key) != last && gen >= 1 {
				last = string(key)
				emit("state", map[string]any{"partitions": ps, "generation": gen, "member_id": memberID})
			}
		}
	}()

	cmds := make(chan map[string]any)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			var c map[string]any
			if json.Unmarshal(sc.Bytes(), &c) == nil {
				cmds <- c
			}
		}
		os.Exit(3) // the parent is gone
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case <-sigs:
			shutdown(cl, cancel, done)
			return
		case c := <-cmds:
			switch c["cmd"] {
			case "close":
				shutdown(cl, cancel, done)
				return
			case "commit":
				commit(cl, c)
			case "fetch":
				fetch(cl, cfg.Group)
			}
		}
	}
}

func shutdown(cl *kgo.Client, cancel context.CancelFunc, done chan struct{}) {
	cancel()
	<-done
	cl.Close() // LeaveGroup for a dynamic member
	emit("closed", nil)
}

func commit(cl *kgo.Client, c map[string]any) {
	offs := map[string]map[int32]kgo.EpochOffset{}
	for _, raw := range c["offsets"].([]any) {
		e := raw.([]any)
		t, p, o := e[0].(string), int32(e[1].(float64)), int64(e[2].(float64))
		if offs[t] == nil {
			offs[t] = map[int32]kgo.EpochOffset{}
		}
		offs[t][p] = kgo.EpochOffset{Epoch: -1, Offset: o}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errText := ""
	var firstErr error
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			firstErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 && firstErr == nil {
					firstErr = fmt.Errorf("%s/%d: error code %d", t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
	})
	if firstErr != nil {
		errText = firstErr.Error()
	}
	emit("committed", map[string]any{"error": errText})
}

func fetch(cl *kgo.Client, group string) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group // all topics (null topic list)
	req.Topics = nil
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		emit("fetched", map[string]any{"error": err.Error()})
		return
	}
	out := [][]any{}
	code := resp.ErrorCode
	for _, g := range resp.Groups {
		if g.ErrorCode != 0 {
			code = g.ErrorCode
		}
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				meta := ""
				if p.Metadata != nil {
					meta = *p.Metadata
				}
				out = append(out, []any{t.Topic, p.Partition, p.Offset, meta})
			}
		}
	}
	for _, t := range resp.Topics {
		if len(resp.Groups) > 0 {
			break // v8+: the groups' answer (franz-go fills both forms)
		}
		for _, p := range t.Partitions {
			meta := ""
			if p.Metadata != nil {
				meta = *p.Metadata
			}
			out = append(out, []any{t.Topic, p.Partition, p.Offset, meta})
		}
	}
	emit("fetched", map[string]any{"offsets": out, "error_code": code})
}
