/*
 * Why the egress relay does not use a sockmap redirect (docs/architecture.md, "The egress relay
 * copies"): a relay between two TCP connections on loopback, measured three ways in one process.
 *
 *   direct   the client reads from the server's connection itself;
 *   copy     a relay thread per direction reads into a 256 KiB buffer and writes it on (what the
 *            engine's relay does once a connection has a fast lane);
 *   splice   the same threads move the bytes with splice(2) through a pipe of that size, never
 *            through user space;
 *   sockmap  the relay puts both sockets in a BPF sockmap whose SK_SKB verdict program redirects
 *            each skb that arrives on one to the other's send side; nothing reaches user space.
 *
 * Build and run as root (loading the program needs CAP_BPF):
 *
 *   cc -O2 -pthread -o sockmap_relay benches/experiments/sockmap_relay.c
 *   ./sockmap_relay direct; ./sockmap_relay copy; ./sockmap_relay sockmap
 *       the rate of a 1 GiB download through each
 *   BUF=4194304 ./sockmap_relay copy; BUF=1048576 ./sockmap_relay splice
 *       the relay's buffer (copy) or pipe (splice) of that many bytes instead of 256 KiB (a pipe
 *       larger than /proc/sys/fs/pipe-max-size needs CAP_SYS_RESOURCE)
 *   ./sockmap_relay copy noread 4000000000; ./sockmap_relay sockmap noread 4000000000
 *       a client that never reads: how much the server can still push, and the host's
 *       MemAvailable drop, every 0.1 s for 3 s (only bounded buffers should fill)
 *
 * In the sockmap mode the relay never sees the server's end of stream, so the client stops after
 * the bytes it expects rather than at EOF.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)
static long relay_buffer = 256 << 10;

static long long total;
static volatile long long pushed;

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static int listen_on(int port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = loopback(port);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 16))
		die("listen");
	return s;
}

static int connect_to(int port)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = loopback(port);
	if (connect(s, (struct sockaddr *)&a, sizeof a))
		die("connect");
	return s;
}

/* Accepts one connection and writes `total` bytes to it as fast as it takes them. */
static void *server(void *listener)
{
	int c = accept((int)(long)listener, NULL, NULL);
	char *buf = malloc(CHUNK);
	memset(buf, 'x', CHUNK);
	for (long long left = total; left > 0;) {
		ssize_t n = write(c, buf, left > CHUNK ? CHUNK : left);
		if (n <= 0)
			break;
		left -= n;
		pushed += n;
	}
	shutdown(c, SHUT_WR);
	pause();
	return NULL;
}

/* One direction of the copying relay: fds[0] to fds[1] until the end of stream. */
static void *copy(void *arg)
{
	int *fds = arg;
	char *buf = malloc(relay_buffer);
	for (;;) {
		ssize_t n = read(fds[0], buf, relay_buffer);
		if (n <= 0)
			break;
		for (char *p = buf; n > 0;) {
			ssize_t w = write(fds[1], p, n);
			if (w <= 0)
				return NULL;
			p += w;
			n -= w;
		}
	}
	shutdown(fds[1], SHUT_WR);
	return NULL;
}

/* One direction of the splicing relay: fds[0] into a pipe and out to fds[1]. */
static void *splicer(void *arg)
{
	int *fds = arg, p[2];
	if (pipe(p))
		die("pipe");
	if (fcntl(p[1], F_SETPIPE_SZ, relay_buffer) < 0)
		perror("F_SETPIPE_SZ");
	for (;;) {
		ssize_t n = splice(fds[0], NULL, p[1], NULL, relay_buffer, SPLICE_F_MOVE | SPLICE_F_MORE);
		if (n <= 0)
			break;
		while (n > 0) {
			ssize_t w = splice(p[0], NULL, fds[1], NULL, n, SPLICE_F_MOVE | SPLICE_F_MORE);
			if (w <= 0)
				return NULL;
			n -= w;
		}
	}
	shutdown(fds[1], SHUT_WR);
	return NULL;
}

static long bpf(int cmd, union bpf_attr *a)
{
	return syscall(__NR_bpf, cmd, a, sizeof *a);
}

/* A sockmap holding the client's side (key 0) and the upstream (key 1); what arrives on the
 * client's side (its local port is the relay's) goes out of the upstream, the rest the other way. */
static void redirect(int client_side, int upstream, int relay_port)
{
	union bpf_attr a;
	memset(&a, 0, sizeof a);
	a.map_type = BPF_MAP_TYPE_SOCKMAP;
	a.key_size = 4;
	a.value_size = 4;
	a.max_entries = 2;
	int map = bpf(BPF_MAP_CREATE, &a);
	if (map < 0)
		die("create the sockmap");
	struct bpf_insn prog[] = {
		{ .code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = 6, .src_reg = 1 },
		{ .code = BPF_LDX | BPF_MEM | BPF_W, .dst_reg = 2, .src_reg = 1,
		  .off = offsetof(struct __sk_buff, local_port) },
		{ .code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 3, .imm = 1 },
		{ .code = BPF_JMP | BPF_JEQ | BPF_K, .dst_reg = 2, .off = 1, .imm = relay_port },
		{ .code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 3, .imm = 0 },
		{ .code = BPF_LD | BPF_DW | BPF_IMM, .dst_reg = 2, .src_reg = BPF_PSEUDO_MAP_FD,
		  .imm = map },
		{ 0 },
		{ .code = BPF_ALU64 | BPF_MOV | BPF_X, .dst_reg = 1, .src_reg = 6 },
		{ .code = BPF_ALU64 | BPF_MOV | BPF_K, .dst_reg = 4, .imm = 0 },
		{ .code = BPF_JMP | BPF_CALL, .imm = BPF_FUNC_sk_redirect_map },
		{ .code = BPF_JMP | BPF_EXIT },
	};
	char log[4096] = { 0 };
	memset(&a, 0, sizeof a);
	a.prog_type = BPF_PROG_TYPE_SK_SKB;
	a.insns = (uint64_t)(uintptr_t)prog;
	a.insn_cnt = sizeof prog / sizeof prog[0];
	a.license = (uint64_t)(uintptr_t) "Apache-2.0";
	a.log_buf = (uint64_t)(uintptr_t)log;
	a.log_size = sizeof log;
	a.log_level = 1;
	int verdict = bpf(BPF_PROG_LOAD, &a);
	if (verdict < 0) {
		fprintf(stderr, "%s\n", log);
		die("load the verdict program");
	}
	memset(&a, 0, sizeof a);
	a.target_fd = map;
	a.attach_bpf_fd = verdict;
	a.attach_type = BPF_SK_SKB_VERDICT;
	if (bpf(BPF_PROG_ATTACH, &a))
		die("attach the verdict program");
	uint32_t keys[2] = { 0, 1 }, socks[2] = { client_side, upstream };
	for (int i = 0; i < 2; i++) {
		memset(&a, 0, sizeof a);
		a.map_fd = map;
		a.key = (uint64_t)(uintptr_t)&keys[i];
		a.value = (uint64_t)(uintptr_t)&socks[i];
		if (bpf(BPF_MAP_UPDATE_ELEM, &a))
			die("add a socket to the sockmap");
	}
}

static long mem_available_kib(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = 0;
	while (fgets(line, sizeof line, f) && sscanf(line, "MemAvailable: %ld", &v) != 1)
		;
	fclose(f);
	return v;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s direct|copy|splice|sockmap [noread [BYTES]]\n", argv[0]);
		return 2;
	}
	const char *mode = argv[1];
	int noread = argc > 2 && !strcmp(argv[2], "noread");
	total = argc > 3 ? atoll(argv[3]) : 1LL << 30;
	int server_port = 30000 + getpid() % 1000, relay_port = server_port + 1000;
	pthread_t t;
	pthread_create(&t, NULL, server, (void *)(long)listen_on(server_port));
	int client;
	if (!strcmp(mode, "direct")) {
		client = connect_to(server_port);
	} else {
		int relay = listen_on(relay_port), one = 1;
		client = connect_to(relay_port);
		int client_side = accept(relay, NULL, NULL), upstream = connect_to(server_port);
		setsockopt(client_side, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		setsockopt(upstream, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		if (getenv("BUF"))
			relay_buffer = atol(getenv("BUF"));
		if (!strcmp(mode, "copy") || !strcmp(mode, "splice")) {
			void *(*relay)(void *) = !strcmp(mode, "copy") ? copy : splicer;
			static int down[2], up[2];
			down[0] = upstream, down[1] = client_side;
			up[0] = client_side, up[1] = upstream;
			pthread_create(&t, NULL, relay, down);
			pthread_create(&t, NULL, relay, up);
		} else {
			redirect(client_side, upstream, relay_port);
		}
	}
	long before = mem_available_kib();
	double start = now();
	if (noread) {
		for (int i = 0; i < 30; i++) {
			usleep(100000);
			printf("%s, client not reading: t=%.1f s, the server pushed %lld MB, MemAvailable -%ld MB\n",
			       mode, now() - start, pushed >> 20, (before - mem_available_kib()) >> 10);
		}
		return 0;
	}
	char *buf = malloc(CHUNK);
	long long got = 0;
	while (got < total) {
		ssize_t n = read(client, buf, CHUNK);
		if (n <= 0)
			break;
		got += n;
	}
	double took = now() - start;
	printf("%s: %lld bytes in %.3f s = %.2f GB/s\n", mode, got, took, got / took / 1e9);
	return 0;
}
