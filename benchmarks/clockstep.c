/* clockstep: an LD_PRELOAD library that steps one process tree's wall clock, for
 * benchmarks/chaos.py's clock_jump fault.
 *
 * CLOCK_REALTIME (clock_gettime, gettimeofday, time) reads as the real clock plus the number
 * of seconds written in the file $CLOCKSTEP_FILE (e.g. -7200 or 10800); CLOCK_MONOTONIC and
 * every sleep and timed wait are left alone, as they are when an administrator or NTP steps a
 * real machine's clock. libfaketime was used before, but with FAKETIME_DONT_FAKE_MONOTONIC its
 * clock_nanosleep wrapper fails every Python time.sleep() with EINVAL (200 of 200 calls,
 * Debian's 0.9.10), so each clock_jump cycle ended in that error instead of meeting a step.
 *
 * The file is read again at most every 50 ms of monotonic time, so a step shows within that.
 *   cc -shared -fPIC -O2 -o clockstep.so benchmarks/clockstep.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime(void) {
    static clock_gettime_fn real;
    if (!real) real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return real;
}

/* The step in nanoseconds, re-read from the file when the last reading is 50 ms old. */
static long long step_ns(void) {
    static long long step, read_at = -1;
    struct timespec now;
    if (real_clock_gettime()(CLOCK_MONOTONIC, &now) != 0) return step;
    long long mono = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (read_at >= 0 && mono - read_at < 50000000LL) return step;
    read_at = mono;
    const char *path = getenv("CLOCKSTEP_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        double seconds;
        if (fscanf(f, "%lf", &seconds) == 1) step = (long long)(seconds * 1e9);
        fclose(f);
    }
    return step;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + step_ns();
    ts->tv_sec = (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
    if (ts->tv_nsec < 0) {
        ts->tv_nsec += 1000000000L;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int done = real_clock_gettime()(id, ts);
    if (done == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return done;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    int done = clock_gettime(CLOCK_REALTIME, &ts);
    if (done == 0) {   /* glibc declares tv nonnull */
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return done;
}

time_t time(time_t *out) {
    struct timespec ts;
    time_t now = clock_gettime(CLOCK_REALTIME, &ts) == 0 ? ts.tv_sec : (time_t)-1;
    if (out) *out = now;
    return now;
}
