/* The floor for bench/floor.py: the least work a Kafka server can do per request.
 *
 * One thread, epoll, non-blocking sockets on 127.0.0.1. Each complete request frame is answered
 * with a fixed "no error" body: Heartbeat (api key 12, v4+) with throttle 0 and error 0,
 * OffsetCommit (api key 8, v8+) with throttle 0 and no topics; any other request, or a frame over
 * 1 MiB, closes the connection. The answers to the frames of one read leave in one write, as
 * herd's do. No decoding beyond the header's first 8 bytes, no state, no log.
 *
 * Built by bench/floor.py with the system C compiler; prints its port on stdout, then serves
 * until SIGTERM. Not part of herd: a measuring stick.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_FRAME (1 << 20)

struct conn {
    int fd;
    unsigned char *in;
    size_t in_len, in_cap;
    unsigned char *out;
    size_t out_len, out_off, out_cap;
};

static void put32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static int reserve(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    unsigned char *b = realloc(*buf, n);
    if (!b) return -1;
    *buf = b;
    *cap = n;
    return 0;
}

static void drop(int ep, struct conn *c) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c->in);
    free(c->out);
    free(c);
}

/* Answer every complete frame in c->in; -1: close the connection. */
static int answer(struct conn *c) {
    size_t pos = 0;
    while (c->in_len - pos >= 4) {
        unsigned char *f = c->in + pos;
        uint32_t size = ((uint32_t)f[0] << 24) | (f[1] << 16) | (f[2] << 8) | f[3];
        if (size < 8 || size > MAX_FRAME) return -1;
        if (c->in_len - pos < 4 + (size_t)size) break;
        int api_key = (f[4] << 8) | f[5];
        unsigned char body[16];
        size_t n;
        put32(body, 0); /* size, set below */
        memcpy(body + 4, f + 8, 4); /* correlation id */
        body[8] = 0; /* response header v1: no tagged fields */
        put32(body + 9, 0); /* throttle_time_ms */
        if (api_key == 12) {
            body[13] = 0; body[14] = 0; /* error_code */
            body[15] = 0; /* tagged fields */
            n = 16;
        } else if (api_key == 8) {
            body[13] = 1; /* topics: an empty compact array */
            body[14] = 0; /* tagged fields */
            n = 15;
        } else {
            return -1;
        }
        put32(body, (uint32_t)(n - 4));
        if (reserve(&c->out, &c->out_cap, c->out_len + n)) return -1;
        memcpy(c->out + c->out_len, body, n);
        c->out_len += n;
        pos += 4 + size;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    return 0;
}

static int flush_out(int ep, struct conn *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EAGAIN) {
                struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
                epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
                return 0;
            }
            if (errno == EINTR) continue;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out_off = c->out_len = 0;
    return 0;
}

static volatile sig_atomic_t stopping = 0;
static void on_term(int sig) { (void)sig; stopping = 1; }

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 1024)) {
        perror("floor_server: listen");
        return 1;
    }
    socklen_t alen = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &alen);
    printf("%d\n", ntohs(addr.sin_port));
    fflush(stdout);

    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    struct epoll_event events[256];
    while (!stopping) {
        int n = epoll_wait(ep, events, 256, 1000);
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c == NULL) {
                for (;;) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *nc = calloc(1, sizeof *nc);
                    if (!nc) { close(fd); continue; }
                    nc->fd = fd;
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (events[i].events & EPOLLOUT) {
                if (flush_out(ep, c)) { drop(ep, c); continue; }
                if (c->out_len == 0) {
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &cev);
                }
            }
            if (!(events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) continue;
            if (reserve(&c->in, &c->in_cap, c->in_len + 65536)) { drop(ep, c); continue; }
            ssize_t r = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) { drop(ep, c); continue; }
            if (r < 0) continue;
            c->in_len += (size_t)r;
            if (answer(c) || flush_out(ep, c)) drop(ep, c);
        }
    }
    return 0;
}
