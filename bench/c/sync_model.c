/* A model of the small all_reduce at many ranks: how should ranks exchange 8 bytes each?
 *
 * Issue 45, item 5, asks whether small messages at 8+ ranks should go by a tree or a
 * dissemination of flags with the data inline, instead of shmcomm's flat step (every rank writes
 * its line, then reads every other rank's line). This program measures the three ways on the
 * machine it runs on, with nothing of shmcomm around them, so the answer comes from the cores
 * and their caches, not from a guess. bench/bench_sync_model.py builds and runs it.
 *
 *   flat    every rank publishes (value, seq) in its own line and reads the n-1 other lines, then
 *           sums in rank order: what shmcomm's one-shot path does (src_cython/coll/reduce.pxi).
 *   doubling recursive doubling (n a power of two): in round k rank r swaps partial sums with
 *           r ^ 2^k through a line per round; each pair adds the lower group's sum first, so
 *           every rank ends with the same bits. log2(n) rounds, one line read per round.
 *   tree    binomial tree to rank 0 (log2(n) rounds), then rank 0 publishes the sum in one line
 *           that every rank reads.
 *
 * Lines are 128 bytes (the adjacent-line prefetcher pairs 64-byte lines) and double-buffered by
 * the iteration's parity: a rank two iterations ahead is impossible (it would need every rank's
 * contribution to the iteration in between), so a line is never overwritten before it is read.
 * Each rank is pinned to one CPU of the process's affinity; waits spin, yielding the CPU every
 * 1024 polls so that more ranks than cores still finish (slowly: such runs say nothing).
 *
 * Usage: sync_model RANKS ITERS  ->  one line per way: "way ranks ns_per_call check"
 * where ns_per_call is the slowest rank's time and check is "ok" when every rank's every sum
 * matched the expected value.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE 128
#define MAX_RANKS 256
#define MAX_ROUNDS 8

typedef struct {
    _Alignas(LINE) volatile uint64_t seq; /* iteration + 1 once value is valid */
    volatile double value;
} line_t;

typedef struct {
    line_t flat[2][MAX_RANKS];                 /* [parity][rank] */
    line_t rounds[2][MAX_ROUNDS][MAX_RANKS];   /* [parity][round][rank]: doubling and the tree */
    line_t result[2];                          /* [parity]: the tree's sum, written by rank 0 */
    _Alignas(LINE) volatile uint64_t ns[MAX_RANKS];
    volatile int wrong;
} shared_t;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void publish(line_t *l, double v, uint64_t seq) {
    l->value = v;
    __atomic_store_n(&l->seq, seq, __ATOMIC_RELEASE);
}

static double await(line_t *l, uint64_t seq) {
    unsigned polls = 0;
    while (__atomic_load_n(&l->seq, __ATOMIC_ACQUIRE) < seq)
        if (++polls % 1024 == 0) sched_yield();
    return l->value;
}

static double flat(shared_t *s, int r, int n, uint64_t it, double mine) {
    int p = it & 1;
    double sum = 0;
    publish(&s->flat[p][r], mine, it + 1);
    for (int q = 0; q < n; q++) sum += q == r ? mine : await(&s->flat[p][q], it + 1);
    return sum;
}

static double doubling(shared_t *s, int r, int n, uint64_t it, double mine) {
    int p = it & 1;
    double part = mine;
    for (int k = 0; (1 << k) < n; k++) {
        int partner = r ^ (1 << k);
        publish(&s->rounds[p][k][r], part, it + 1);
        double theirs = await(&s->rounds[p][k][partner], it + 1);
        part = partner < r ? theirs + part : part + theirs; /* the lower group first */
    }
    return part;
}

static double tree(shared_t *s, int r, int n, uint64_t it, double mine) {
    int p = it & 1, k;
    double part = mine;
    for (k = 0; (1 << k) < n; k++) {
        if (r & (1 << k)) { /* send to the parent and stop */
            publish(&s->rounds[p][k][r], part, it + 1);
            break;
        }
        if (r + (1 << k) < n) part = part + await(&s->rounds[p][k][r + (1 << k)], it + 1);
    }
    if (r == 0) {
        publish(&s->result[p], part, it + 1);
        return part;
    }
    return await(&s->result[p], it + 1);
}

typedef double (*way_t)(shared_t *, int, int, uint64_t, double);

static void rank_main(shared_t *s, int r, int n, long iters, way_t way, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    long warm = iters / 10 + 1;
    uint64_t start = 0;
    for (long i = 0; i < warm + iters; i++) {
        if (i == warm) start = now_ns();
        /* rank q contributes q + (i mod 7): small integers, so every order gives exact sums */
        double got = way(s, r, n, (uint64_t)i, (double)(r + i % 7));
        double want = (double)n * (n - 1) / 2 + (double)n * (i % 7);
        if (got != want) s->wrong = 1;
    }
    s->ns[r] = now_ns() - start;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s RANKS ITERS\n", argv[0]);
        return 2;
    }
    int n = atoi(argv[1]);
    long iters = atol(argv[2]);
    if (n < 1 || n > MAX_RANKS || iters < 1) {
        fprintf(stderr, "RANKS must be 1-%d and ITERS >= 1\n", MAX_RANKS);
        return 2;
    }
    cpu_set_t allowed;
    sched_getaffinity(0, sizeof allowed, &allowed);
    int cpus[CPU_SETSIZE], ncpus = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;
    const char *names[] = {"flat", "doubling", "tree"};
    way_t ways[] = {flat, doubling, tree};
    for (int w = 0; w < 3; w++) {
        if (w == 1 && (n & (n - 1))) continue; /* recursive doubling: powers of two only */
        shared_t *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) {
            perror("mmap");
            return 1;
        }
        memset((void *)s, 0, sizeof *s);
        pid_t pids[MAX_RANKS];
        for (int r = 0; r < n; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                rank_main(s, r, n, iters, ways[w], cpus[r % ncpus]);
                _exit(0);
            }
        }
        int failed = 0, status;
        for (int r = 0; r < n; r++)
            if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) failed = 1;
        uint64_t slowest = 0;
        for (int r = 0; r < n; r++)
            if (s->ns[r] > slowest) slowest = s->ns[r];
        printf("%s %d %.1f %s\n", names[w], n, (double)slowest / iters, failed || s->wrong ? "WRONG" : "ok");
        fflush(stdout);
        munmap(s, sizeof *s);
    }
    return 0;
}
