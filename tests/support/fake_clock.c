/* A wall clock the test sets: loaded into a server with LD_PRELOAD, it answers
 * clock_gettime(CLOCK_REALTIME*), gettimeofday and time from a u64 of nanoseconds in the
 * file named by RL_FAKE_CLOCK (mapped shared, so the test moves it with one aligned store).
 * 0 there means the real clock. Other clocks (the event loop's monotonic one) pass through.
 * Built by tests/pin_storm.rs: its checker needs the exact instant of every decision, which
 * replies and replicated effects do not carry.
 *
 * Valkey 9 is not covered: it keeps its wall time as the last reading plus TSC ticks since
 * (resynced by its cron), so its TIME and key expiry see a new instant only up to 100 ms
 * late; the test checks and says so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t *fake;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

static void setup(void) {
    if (!real_clock_gettime)
        real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    if (fake)
        return;
    const char *path = getenv("RL_FAKE_CLOCK");
    if (!path)
        return;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    void *p = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED)
        fake = p;
}

static uint64_t fake_now(void) {
    setup();
    return fake ? __atomic_load_n(fake, __ATOMIC_SEQ_CST) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE) {
        uint64_t ns = fake_now();
        if (ns) {
            ts->tv_sec = (time_t)(ns / 1000000000u);
            ts->tv_nsec = (long)(ns % 1000000000u);
            return 0;
        }
    }
    setup();
    return real_clock_gettime(id, ts);
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t)
        *t = ts.tv_sec;
    return ts.tv_sec;
}
