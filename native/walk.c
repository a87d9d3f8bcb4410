/* warren-walk: the supervisor's walks of a writable root, in one native pass.
 *
 * Every launch walks the workspace twice (server.links: every regular file's link
 * count; server.gitfind: every directory, for what host git would take for a
 * repository). In Python that is a scandir iterator and a stat result object per file;
 * here it is getdents64 (whose d_type tells directories and links apart with no stat)
 * and one fstatat per regular file. The Python walks stay as the fallback and give
 * the same answers (tests/test_treewalk.py runs both on the same trees).
 *
 * The root is the descriptor argv[2] (inherited), opened by the caller (a directory it trusts by its path). Every
 * directory beneath is opened with openat(O_DIRECTORY|O_NOFOLLOW) beneath its parent's
 * descriptor: a link is never followed, a directory swapped for one is skipped, as in
 * the Python walks. One descriptor per level is held.
 *
 * On more than one CPU, threads walk side by side (one per CPU, at most MAX_THREADS):
 * each walks a subtree depth first as above, and while another thread is idle it hands
 * it a subdirectory instead of descending into it. The taker opens that directory by
 * its path from the root with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS): no link is followed there either, at any component. Only
 * paths shorter than HAND_MAX are handed (a deeper one is walked by its finder, from
 * descriptors, at any depth). Each thread keeps its records in memory; they are written
 * once all are done. Where openat2 is refused (an old kernel, a filter), one thread.
 *
 * argv[1]: "l" (links), "g" (git) or "lg" (both, one pass), with "b" for a walk in the
 * background (niceness BACKGROUND_NICE, taken before any thread is made: every thread
 * inherits it; set from outside after the start, a worker made first kept 0); argv[2]:
 * the root's fd;
 * argv[3] (optional): how many threads, whatever the CPUs (1: the single walk; the
 * tests' way to run both).
 * Output on fd 1, little-endian, paths relative to the root, without a terminator:
 *   'L' u64 dev, u64 ino, u64 nlink, u32 len, path   a regular file with nlink > 1
 *   'G' u8 kind, u32 len, path                       a directory git would see:
 *        kind 1: shaped like a bare repository (HEAD, objects/, refs/);
 *        2: holds a .git directory; 3: holds a .git file starting "gitdir: "
 *        (at most 4096 bytes, as server.gitfind reads it)
 *   'E'                                              the walk ended (absent: it failed)
 * The git walk descends at most 64 levels, not into .git, and not beneath a bare
 * repository (the link walk goes everywhere). Exit 0, or 2 when the walk could not be
 * finished faithfully (out of descriptors or memory): the caller walks in Python then.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#else /* headers older than Linux 5.6: the kernel's ABI, as it defines it */
struct open_how {
    uint64_t flags, mode, resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#endif
#ifndef SYS_openat2
#define SYS_openat2 437 /* the same number on every architecture */
#endif

#define GIT_DEPTH 64
#define GITFILE_LIMIT 4096
#define MAX_THREADS 4
#define BACKGROUND_NICE 10 /* _core.treewalk.BACKGROUND_NICE */
#define HAND_MAX 2048 /* the longest path handed to another thread (well below PATH_MAX) */
#define DENTS_SIZE (1 << 16)

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static int links_on, git_on;
static int top_fd;

static void die(int code) { _exit(code); }

/* One thread's walk: its records (in memory until the end), the path of the directory
 * it reads (relative to the root, grown as needed), its getdents buffer. */
struct walker {
    char *out;
    size_t out_len, out_cap;
    char *path;
    size_t path_cap;
    char *dents;
};

static void put(struct walker *w, const void *p, size_t n) {
    if (w->out_len + n > w->out_cap) {
        size_t cap = w->out_cap ? w->out_cap : 1 << 16;
        while (cap < w->out_len + n) cap *= 2;
        char *grown = realloc(w->out, cap);
        if (!grown) die(2);
        w->out = grown;
        w->out_cap = cap;
    }
    memcpy(w->out + w->out_len, p, n);
    w->out_len += n;
}

static void put_u64(struct walker *w, uint64_t v) { put(w, &v, 8); } /* little-endian hosts only (x86, arm64) */
static void put_u32(struct walker *w, uint32_t v) { put(w, &v, 4); }

static void path_reserve(struct walker *w, size_t n) {
    if (n <= w->path_cap) return;
    size_t cap = w->path_cap ? w->path_cap : 4096;
    while (cap < n) cap *= 2;
    char *p = realloc(w->path, cap);
    if (!p) die(2);
    w->path = p;
    w->path_cap = cap;
}

static void put_path(struct walker *w, size_t len, const char *name) {
    size_t nlen = strlen(name);
    uint32_t total = (uint32_t)(len + (len ? 1 : 0) + nlen);
    put_u32(w, total);
    put(w, w->path, len);
    if (len) put(w, "/", 1);
    put(w, name, nlen);
}

/* A level of the walk: its descriptor, where its path ends, its subdirectories not yet
 * visited (NUL-separated names), whether the git walk still looks here. */
struct level {
    int fd;
    size_t path_len;
    char *names;
    size_t pos, end;
    int depth, git;
};

/* A directory handed from one thread to another: its path from the root. */
struct item {
    char *rel;
    size_t len;
    int depth, git;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct item *items;
    size_t n, cap;
    int threads, idle;
} shared = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int gitfile(int dfd) {
    int fd = openat(dfd, ".git", O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    char buf[8];
    size_t got = 0;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    /* as gitfind reads it: a larger file is refused whole (read_file's limit) */
    if (ok && st.st_size > GITFILE_LIMIT) ok = 0;
    while (ok && got < sizeof buf) {
        ssize_t n = read(fd, buf + got, sizeof buf - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fd);
    return ok && got == sizeof buf && memcmp(buf, "gitdir: ", 8) == 0;
}

static int kind_of(int fd, unsigned char type, const char *name) {
    if (type != DT_UNKNOWN) return type;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return DT_UNKNOWN;
    if (S_ISDIR(st.st_mode)) return DT_DIR;
    if (S_ISREG(st.st_mode)) return DT_REG;
    return DT_LNK; /* anything else: neither walk looks at it */
}

/* Read the directory of `lv` (its fd, its path in `w->path`): report what is asked, and
 * collect its subdirectories to visit. */
static void read_dir(struct walker *w, struct level *lv) {
    size_t cap = 0;
    lv->names = NULL;
    lv->pos = lv->end = 0;
    int head = 0, objects = 0, refs = 0, dotgit = 0; /* dotgit: 1 dir, 2 file */
    int looking = git_on && lv->git && lv->depth <= GIT_DEPTH;
    for (;;) {
        long n = syscall(SYS_getdents64, lv->fd, w->dents, DENTS_SIZE);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* end, or the rest cannot be read: passed over */
        for (long off = 0; off < n;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(w->dents + off);
            off += d->d_reclen;
            const char *name = d->d_name;
            if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2]))) continue;
            int type = d->d_type;
            if (type == DT_UNKNOWN) type = kind_of(lv->fd, DT_UNKNOWN, name);
            if (looking) {
                if (!strcmp(name, "HEAD")) head = 1;
                else if (type == DT_DIR && !strcmp(name, "objects")) objects = 1;
                else if (type == DT_DIR && !strcmp(name, "refs")) refs = 1;
                else if (!strcmp(name, ".git")) dotgit = type == DT_DIR ? 1 : type == DT_REG ? 2 : 0;
            }
            if (type == DT_DIR) {
                size_t len = strlen(name) + 1;
                if (lv->end + len > cap) {
                    size_t ncap = cap ? cap * 2 : 4096;
                    while (ncap < lv->end + len) ncap *= 2;
                    char *p = realloc(lv->names, ncap);
                    if (!p) die(2);
                    lv->names = p;
                    cap = ncap;
                }
                memcpy(lv->names + lv->end, name, len);
                lv->end += len;
            } else if (type == DT_REG && links_on) {
                struct stat st;
                if (fstatat(lv->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
                /* swapped for something else since it was listed: not a file's name */
                if (!S_ISREG(st.st_mode) || st.st_nlink <= 1) continue;
                put(w, "L", 1);
                put_u64(w, (uint64_t)st.st_dev);
                put_u64(w, (uint64_t)st.st_ino);
                put_u64(w, (uint64_t)st.st_nlink);
                put_path(w, lv->path_len, name);
            }
        }
    }
    if (!looking) return;
    int kind = head && objects && refs ? 1 : dotgit == 1 ? 2 : dotgit == 2 && gitfile(lv->fd) ? 3 : 0;
    if (kind) {
        put(w, "G", 1);
        unsigned char k = (unsigned char)kind;
        put(w, &k, 1);
        put_u32(w, (uint32_t)lv->path_len);
        put(w, w->path, lv->path_len);
    }
    if (kind == 1) lv->git = 0; /* a bare repository's insides are not walked for git */
}

/* Whether a thread waits for work (read without the lock: a hint; a handed item is
 * taken by whichever thread is free). */
static int someone_idle(void) { return __atomic_load_n(&shared.idle, __ATOMIC_RELAXED) > 0; }

static void hand(const char *rel, size_t len, int depth, int git) {
    char *copy = malloc(len + 1);
    if (!copy) die(2);
    memcpy(copy, rel, len);
    copy[len] = 0;
    pthread_mutex_lock(&shared.mu);
    if (shared.n == shared.cap) {
        size_t cap = shared.cap ? shared.cap * 2 : 256;
        struct item *p = realloc(shared.items, cap * sizeof *p);
        if (!p) die(2);
        shared.items = p;
        shared.cap = cap;
    }
    shared.items[shared.n++] = (struct item){.rel = copy, .len = len, .depth = depth, .git = git};
    pthread_cond_signal(&shared.cv);
    pthread_mutex_unlock(&shared.mu);
}

/* A handed directory, opened by its path from the root without following any link:
 * -1 when it is gone, a link now, or not ours to read (passed over, as in the walk). */
static int open_handed(const struct item *it) {
    struct open_how how = {
        .flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    for (int tries = 0;; tries++) {
        long fd = syscall(SYS_openat2, top_fd, it->rel, &how, sizeof how);
        if (fd >= 0) return (int)fd;
        if ((errno == EAGAIN || errno == EINTR) && tries < 100) continue; /* a rename raced */
        /* gone, a link now (at any component), not a directory, or not ours to read */
        if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR || errno == EACCES || errno == EXDEV)
            return -1;
        die(2); /* anything else (out of descriptors, a refused call): walked in Python */
    }
}

/* Walk the subtree at `fd` (its path `rel`), depth first from descriptors. */
static void walk_from(struct walker *w, int fd, const char *rel, size_t rel_len, int depth, int git) {
    path_reserve(w, rel_len + 1);
    memcpy(w->path, rel, rel_len);
    size_t depth_cap = 64, top = 0;
    struct level *stack = malloc(depth_cap * sizeof *stack);
    if (!stack) die(2);
    stack[0] = (struct level){.fd = fd, .path_len = rel_len, .depth = depth, .git = git};
    read_dir(w, &stack[0]);
    for (;;) {
        struct level *lv = &stack[top];
        if (lv->pos >= lv->end) {
            free(lv->names);
            close(lv->fd);
            if (top == 0) break;
            top--;
            continue;
        }
        const char *name = lv->names + lv->pos;
        size_t nlen = strlen(name);
        lv->pos += nlen + 1;
        /* the git walk does not go into .git; the link walk does */
        int child_git = lv->git && strcmp(name, ".git") != 0 && lv->depth + 1 <= GIT_DEPTH;
        if (!links_on && !child_git) continue;
        size_t len = lv->path_len + (lv->path_len ? 1 : 0) + nlen;
        path_reserve(w, len + 1);
        if (lv->path_len) w->path[lv->path_len] = '/';
        memcpy(w->path + len - nlen, name, nlen);
        if (shared.threads > 1 && len < HAND_MAX && someone_idle()) {
            hand(w->path, len, lv->depth + 1, child_git);
            continue;
        }
        int cfd = openat(lv->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (cfd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) die(2);
            continue; /* gone, a link now, or not ours to read: passed over */
        }
        if (top + 1 == depth_cap) {
            depth_cap *= 2;
            struct level *p = realloc(stack, depth_cap * sizeof *stack);
            if (!p) die(2);
            stack = p;
            lv = &stack[top];
        }
        struct level *child = &stack[++top];
        *child = (struct level){.fd = cfd, .path_len = len, .depth = lv->depth + 1, .git = child_git};
        read_dir(w, child);
    }
    free(stack);
}

/* A thread: takes handed directories until every thread waits and none is left. */
static void *worker(void *arg) {
    struct walker *w = arg;
    for (;;) {
        pthread_mutex_lock(&shared.mu);
        __atomic_add_fetch(&shared.idle, 1, __ATOMIC_RELAXED);
        while (shared.n == 0 && shared.idle < shared.threads)
            pthread_cond_wait(&shared.cv, &shared.mu);
        if (shared.n == 0) { /* all wait, nothing left: the walk is done */
            pthread_cond_broadcast(&shared.cv);
            pthread_mutex_unlock(&shared.mu);
            return NULL;
        }
        struct item it = shared.items[--shared.n];
        __atomic_sub_fetch(&shared.idle, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&shared.mu);
        int fd = it.len == 0 ? dup(top_fd) : open_handed(&it);
        if (fd >= 0)
            walk_from(w, fd, it.rel, it.len, it.depth, it.git);
        else if (it.len == 0)
            die(2);
        free(it.rel);
    }
}

static int cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    int n = CPU_COUNT(&set);
    return n < 1 ? 1 : n;
}

/* Whether openat2 with the resolve flags handed directories need is there. */
static int has_openat2(void) {
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    long fd = syscall(SYS_openat2, top_fd, ".", &how, sizeof how);
    if (fd < 0) return 0;
    close((int)fd);
    return 1;
}

static void write_all(const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(1, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            die(2);
        }
        p += k;
        n -= (size_t)k;
    }
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) return 64;
    char *rest;
    long root = strtol(argv[2], &rest, 10);
    if (*rest || root < 0 || root > 1 << 30) return 64;
    long asked = 0;
    if (argc == 4) {
        asked = strtol(argv[3], &rest, 10);
        if (*rest || asked < 1 || asked > MAX_THREADS) return 64;
    }
    /* a description of our own: reading the caller's would move its offset */
    top_fd = openat((int)root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top_fd < 0) return 2;
    close((int)root);
    links_on = strchr(argv[1], 'l') != NULL;
    git_on = strchr(argv[1], 'g') != NULL;
    if (strchr(argv[1], 'b') != NULL) {
        errno = 0;
        int now = getpriority(PRIO_PROCESS, 0);
        if (errno == 0 && now < BACKGROUND_NICE)
            (void)setpriority(PRIO_PROCESS, 0, BACKGROUND_NICE); /* refused: walked as it is */
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    int threads = asked ? (int)asked : cpus();
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > 1 && !has_openat2()) threads = 1;
    shared.threads = threads;
    struct walker walkers[MAX_THREADS];
    memset(walkers, 0, sizeof walkers);
    for (int i = 0; i < threads; i++) {
        walkers[i].dents = malloc(DENTS_SIZE);
        if (!walkers[i].dents) die(2);
    }
    hand("", 0, 0, 1); /* the root, taken by the first free thread */
    pthread_t ids[MAX_THREADS];
    int started = 1;
    while (started < threads && pthread_create(&ids[started], NULL, worker, &walkers[started]) == 0)
        started++;
    if (started < threads) { /* no more threads to be had (a process limit): these walk it */
        pthread_mutex_lock(&shared.mu);
        shared.threads = started;
        pthread_cond_broadcast(&shared.cv);
        pthread_mutex_unlock(&shared.mu);
    }
    worker(&walkers[0]);
    for (int i = 1; i < started; i++) pthread_join(ids[i], NULL);
    for (int i = 0; i < started; i++) write_all(walkers[i].out, walkers[i].out_len);
    write_all("E", 1);
    return 0;
}
