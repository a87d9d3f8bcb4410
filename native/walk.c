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
 * argv[1]: "l" (links), "g" (git) or "lg" (both, one pass); argv[2]: the root's fd.
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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define GIT_DEPTH 64
#define GITFILE_LIMIT 4096

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

static char out[1 << 16];
static size_t out_len;
static int links_on, git_on;

static void die(int code) { _exit(code); }

static void flush(void) {
    size_t done = 0;
    while (done < out_len) {
        ssize_t n = write(1, out + done, out_len - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            die(2);
        }
        done += (size_t)n;
    }
    out_len = 0;
}

static void put(const void *p, size_t n) {
    const char *s = p;
    while (n > 0) {
        if (out_len == sizeof out) flush();
        size_t room = sizeof out - out_len, k = n < room ? n : room;
        memcpy(out + out_len, s, k);
        out_len += k;
        s += k;
        n -= k;
    }
}

static void put_u64(uint64_t v) { put(&v, 8); } /* little-endian hosts only (x86, arm64) */
static void put_u32(uint32_t v) { put(&v, 4); }

/* the path of the directory being read, relative to the root, grown as needed */
static char *path;
static size_t path_cap;

static void path_reserve(size_t n) {
    if (n <= path_cap) return;
    size_t cap = path_cap ? path_cap : 4096;
    while (cap < n) cap *= 2;
    char *p = realloc(path, cap);
    if (!p) die(2);
    path = p;
    path_cap = cap;
}

static void put_path(size_t len, const char *name) {
    size_t nlen = strlen(name);
    uint32_t total = (uint32_t)(len + (len ? 1 : 0) + nlen);
    put_u32(total);
    put(path, len);
    if (len) put("/", 1);
    put(name, nlen);
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

/* Read the directory of `lv` (its fd, its path in `path`): report what is asked, and
 * collect its subdirectories to visit. */
static void read_dir(struct level *lv) {
    static char *buf;
    static const size_t bufsize = 1 << 16;
    if (!buf && !(buf = malloc(bufsize))) die(2);
    size_t cap = 0;
    lv->names = NULL;
    lv->pos = lv->end = 0;
    int head = 0, objects = 0, refs = 0, dotgit = 0; /* dotgit: 1 dir, 2 file */
    int looking = git_on && lv->git && lv->depth <= GIT_DEPTH;
    for (;;) {
        long n = syscall(SYS_getdents64, lv->fd, buf, bufsize);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break; /* end, or the rest cannot be read: passed over */
        for (long off = 0; off < n;) {
            struct linux_dirent64 *d = (struct linux_dirent64 *)(buf + off);
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
                put("L", 1);
                put_u64((uint64_t)st.st_dev);
                put_u64((uint64_t)st.st_ino);
                put_u64((uint64_t)st.st_nlink);
                put_path(lv->path_len, name);
            }
        }
    }
    if (!looking) return;
    int kind = head && objects && refs ? 1 : dotgit == 1 ? 2 : dotgit == 2 && gitfile(lv->fd) ? 3 : 0;
    if (kind) {
        put("G", 1);
        unsigned char k = (unsigned char)kind;
        put(&k, 1);
        put_u32((uint32_t)lv->path_len);
        put(path, lv->path_len);
    }
    if (kind == 1) lv->git = 0; /* a bare repository's insides are not walked for git */
}

int main(int argc, char **argv) {
    if (argc != 3) return 64;
    char *rest;
    long root = strtol(argv[2], &rest, 10);
    if (*rest || root < 0 || root > 1 << 30) return 64;
    /* a description of our own: reading the caller's would move its offset */
    int top_fd = openat((int)root, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top_fd < 0) return 2;
    close((int)root);
    links_on = strchr(argv[1], 'l') != NULL;
    git_on = strchr(argv[1], 'g') != NULL;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    path_reserve(4096);
    size_t depth_cap = 64, top = 0;
    struct level *stack = malloc(depth_cap * sizeof *stack);
    if (!stack) die(2);
    stack[0] = (struct level){.fd = top_fd, .path_len = 0, .depth = 0, .git = 1};
    read_dir(&stack[0]);
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
        int git = lv->git && strcmp(name, ".git") != 0 && lv->depth + 1 <= GIT_DEPTH;
        if (!links_on && !git) continue;
        int fd = openat(lv->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
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
        size_t len = lv->path_len + (lv->path_len ? 1 : 0) + nlen;
        path_reserve(len + 1);
        if (lv->path_len) path[lv->path_len] = '/';
        memcpy(path + len - nlen, name, nlen);
        struct level *child = &stack[++top];
        *child = (struct level){.fd = fd, .path_len = len, .depth = lv->depth + 1, .git = git};
        read_dir(child);
    }
    free(stack);
    put("E", 1);
    flush();
    return 0;
}
