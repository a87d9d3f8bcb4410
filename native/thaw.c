/* warren-thaw: the guard a sandbox paused by its freezer keeps, which thaws it if the
 * supervisor dies.
 *
 * Frozen tasks cannot die, not even of the parent-death signal, until thawed; nobody
 * else would thaw them before the next supervisor's sweep. A sandbox may stay paused
 * for hours (an agent's, between sessions), so the guard is this program: a few pages,
 * where a Python guard held about 1.5 MB of its own (``server/pause.py``, which spawns
 * it from a sealed memfd and keeps the Python guard as the fallback).
 *
 * fd 3: a stream socket whose other end only the supervisor holds.
 *   <- the freezer group's directory, then "\n"
 *   <- "r" (thawed, or gone: nothing to do), or the end of the stream without a word
 *      (the supervisor died: thaw)
 * Thawing writes "THAWED" to the v1 group's freezer.state, or "0" to a cgroup2 group's
 * cgroup.freeze (the group is a v2 one when it has cgroup.controllers, as
 * ``cgroups.is_v2`` says). The group's directory is warren's own (made by the
 * supervisor beneath the caller's group), never a path the sandbox can write.
 * It reads nothing else and holds no other descriptor. Exits 0 either way; 1 when it
 * could not thaw. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHANNEL 3

static int write_file(const char *dir, const char *file, const char *value) {
    char path[PATH_MAX];
    size_t n = strlen(dir);
    if (n + 1 + strlen(file) + 1 > sizeof path) return -1;
    memcpy(path, dir, n);
    path[n] = '/';
    strcpy(path + n + 1, file);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t len = (ssize_t)strlen(value);
    ssize_t w;
    do w = write(fd, value, (size_t)len);
    while (w < 0 && errno == EINTR);
    close(fd);
    return w == len ? 0 : -1;
}

static int is_v2(const char *dir) {
    char path[PATH_MAX];
    size_t n = strlen(dir);
    const char *name = "/cgroup.controllers";
    if (n + strlen(name) + 1 > sizeof path) return 0;
    memcpy(path, dir, n);
    strcpy(path + n, name);
    struct stat st;
    return stat(path, &st) == 0;
}

int main(void) {
    syscall(SYS_close_range, CHANNEL + 1, ~0U, 0); /* whatever else it was given */
    prctl(PR_SET_NAME, "warren-thaw", 0, 0, 0);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* The group's directory, up to its newline; what follows it may come in the same read. */
    char said[PATH_MAX + 2];
    size_t got = 0;
    char *newline = NULL;
    while (newline == NULL) {
        if (got == sizeof said) return 0; /* no group's path is that long: nothing to guard */
        ssize_t r = read(CHANNEL, said + got, sizeof said - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0; /* never told what it guards */
        newline = memchr(said + got, '\n', (size_t)r);
        got += (size_t)r;
    }
    *newline = '\0';
    size_t after = got - (size_t)(newline + 1 - said);
    char word = 0;
    if (after == 0) {
        ssize_t r;
        do r = read(CHANNEL, &word, 1);
        while (r < 0 && errno == EINTR);
        if (r <= 0) word = 0;
    } else {
        word = newline[1];
    }
    if (word != 0) return 0; /* thawed, or gone */
    const char *dir = said;
    if (is_v2(dir)) return write_file(dir, "cgroup.freeze", "0") == 0 ? 0 : 1;
    return write_file(dir, "freezer.state", "THAWED") == 0 ? 0 : 1;
}
