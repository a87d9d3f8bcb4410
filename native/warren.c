/*
 * warren's native front end: `warren run` and `warren exec` on their common path,
 * without starting a Python interpreter (whose own start alone costs twice a whole
 * bubblewrap sandbox).
 *
 * It does only what the Python CLI (src/warren/cli) does on that path, and hands
 * everything else to it, unchanged:
 *
 *  - before anything is sent (other commands, any flag, a terminal on 0/1/2, no
 *    supervisor running, a state directory that does not pass the checks, anything
 *    not plain UTF-8): it execs the Python CLI (`warren-python` beside this binary)
 *    with the same arguments and environment, as if it had been called directly;
 *  - once the request is sent, it waits for the command's Started and Exited. When
 *    either is anything but the plain case (warnings, a non-zero status, a limit, a
 *    timeout, an error, a network event but an allowed request, a lost connection), it execs the Python CLI
 *    to carry on with the same connection (WARREN_NATIVE_RESUME): the unread message
 *    is still on the socket (it is only peeked here), the signals that arrived meanwhile
 *    are still pending (blocked here, the mask survives exec), so every message, hint
 *    and exit code comes from the one Python implementation.
 *
 * The request is the same JSON the Python CLI sends (protocol.RunRequest /
 * ExecRequest, framed as in wire.py: two 32-bit big-endian lengths, then the JSON),
 * with the command's stdio descriptors attached. tests/test_native_cli.py compares
 * the two requests byte for byte as the supervisor decodes them.
 *
 * WARREN_PROTOCOL is protocol.VERSION, passed in by the build hook (hatch_build.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef WARREN_PROTOCOL
#error "WARREN_PROTOCOL (protocol.VERSION) must be defined by the build"
#endif

#define UNTAKEN "untaken" /* in place of a Started: the request was never read (attach.py) */
#define MAX_PEEK 65536 /* a Started or Exited larger than this goes to the Python CLI */

extern char **environ;
static char **g_argv;

/* ---- handing over to the Python CLI --------------------------------------------- */

static void python_cli_path(char *out, size_t size)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out, size, "warren-python");
        return;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = 0;
    snprintf(out, size, "%s/warren-python", self);
}

static void __attribute__((noreturn)) exec_python(void)
{
    char path[PATH_MAX + 32];
    python_cli_path(path, sizeof path);
    if (strchr(path, '/') != NULL)
        execv(path, g_argv);
    else
        execvp(path, g_argv);
    dprintf(2, "warren: cannot start the Python CLI %s: %s\n", path, strerror(errno));
    dprintf(2, "warren: hint: reinstall warren (its `warren-python` belongs beside `warren`)\n");
    _exit(125);
}

/* Nothing sent yet: the Python CLI does it all, as if it had been called directly. */
static void __attribute__((noreturn)) fallback(void)
{
    exec_python();
}

/* The request is out: the Python CLI carries on with this connection. */
static void __attribute__((noreturn)) resume(int sock, int net_r, const char *started, size_t started_len)
{
    size_t size = started_len + 64;
    char *value = malloc(size);
    if (value == NULL)
        _exit(125);
    int head = snprintf(value, size, "%d %d ", sock, net_r);
    memcpy(value + head, started, started_len);
    value[head + started_len] = 0;
    if (setenv("WARREN_NATIVE_RESUME", value, 1) != 0)
        _exit(125);
    fcntl(sock, F_SETFD, 0);
    if (net_r >= 0)
        fcntl(net_r, F_SETFD, 0);
    exec_python();
}

/* ---- a growing buffer and the request's JSON -------------------------------------- */

struct buf {
    char *data;
    size_t len, cap;
};

static void put(struct buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (grown == NULL)
            fallback();
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void puts_(struct buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* Whether s[0..n) is UTF-8 that Python decodes strictly (no surrogates, no overlongs). */
static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
            cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            len = 3;
            cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            len = 4;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + len > n)
            return 0;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += len;
    }
    return 1;
}

/* A JSON string as Python's json encoder writes it with ensure_ascii off (jsonc.dumps). */
static void put_string(struct buf *b, const char *s, size_t n)
{
    if (!valid_utf8((const unsigned char *)s, n))
        fallback();
    put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"': put(b, "\\\"", 2); break;
        case '\\': put(b, "\\\\", 2); break;
        case '\n': put(b, "\\n", 2); break;
        case '\r': put(b, "\\r", 2); break;
        case '\t': put(b, "\\t", 2); break;
        case '\b': put(b, "\\b", 2); break;
        case '\f': put(b, "\\f", 2); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                put(b, esc, 6);
            } else {
                put(b, (const char *)&s[i], 1);
            }
        }
    }
    put(b, "\"", 1);
}

static void put_list(struct buf *b, const char **items, int n)
{
    put(b, "[", 1);
    for (int i = 0; i < n; i++) {
        if (i)
            put(b, ",", 1);
        put_string(b, items[i], strlen(items[i]));
    }
    put(b, "]", 1);
}

/* NAME=VALUE pairs as a JSON object. */
static void put_pairs(struct buf *b, const char **pairs, int n)
{
    put(b, "{", 1);
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(pairs[i], '=');
        if (i)
            put(b, ",", 1);
        put_string(b, pairs[i], (size_t)(eq - pairs[i]));
        put(b, ":", 1);
        put_string(b, eq + 1, strlen(eq + 1));
    }
    put(b, "}", 1);
}

static void put_argv(struct buf *b, char **argv)
{
    put(b, "[", 1);
    for (int i = 0; argv[i] != NULL; i++) {
        if (i)
            put(b, ",", 1);
        put_string(b, argv[i], strlen(argv[i]));
    }
    put(b, "]", 1);
}

/* The caller's environment as Python's dict(os.environ): every entry has '=' and a
   name of its own, or the Python CLI decides what to make of it. */
static void put_environ(struct buf *b)
{
    put(b, "{", 1);
    for (int i = 0; environ[i] != NULL; i++) {
        const char *eq = strchr(environ[i], '=');
        if (eq == NULL || eq == environ[i])
            fallback();
        size_t klen = (size_t)(eq - environ[i]);
        for (int j = 0; j < i; j++)
            if (strncmp(environ[j], environ[i], klen + 1) == 0)
                fallback();
        if (i)
            put(b, ",", 1);
        put_string(b, environ[i], klen);
        put(b, ":", 1);
        put_string(b, eq + 1, strlen(eq + 1));
    }
    put(b, "}", 1);
}

/* PEP 538: the Python CLI's interpreter, started in the C locale, sets LC_CTYPE=C.UTF-8
   in its environment, which a run sends to the sandbox; so does this. Returns 0 where
   Python would do more (PYTHONCOERCECLOCALE=warn prints a warning). */
static int coerce_c_locale(void)
{
    const char *lc_all = getenv("LC_ALL"), *opt = getenv("PYTHONCOERCECLOCALE");
    if (lc_all != NULL && lc_all[0] != 0)
        return 1;
    if (opt != NULL && strcmp(opt, "0") == 0)
        return 1;
    if (opt != NULL && opt[0] != 0 && strcmp(opt, "1") != 0)
        return 0;
    setlocale(LC_CTYPE, "");
    const char *now = setlocale(LC_CTYPE, NULL);
    if (now == NULL || (strcmp(now, "C") != 0 && strcmp(now, "POSIX") != 0))
        return 1;
    static const char *const targets[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        if (setlocale(LC_CTYPE, targets[i]) != NULL)
            return setenv("LC_CTYPE", targets[i], 1) == 0;
    }
    return 1;
}

/* ---- the state directory and the supervisor's address (statedir.py, connect.py) --- */

static int private_dir(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return 0;
    return 1;
}

/* statedir.location, where it is plain; anything unusual goes to the Python CLI. */
static void state_location(char *out, size_t size)
{
    const char *base = getenv("XDG_STATE_HOME");
    char tmp[PATH_MAX];
    if (base != NULL && base[0] == '/') {
        snprintf(tmp, sizeof tmp, "%s", base);
    } else {
        const char *home = getenv("HOME");
        if (home == NULL || home[0] != '/')
            fallback();
        snprintf(tmp, sizeof tmp, "%s/.local/state", home);
    }
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/')
        tmp[--n] = 0;
    if (strstr(tmp, "//") || strstr(tmp, "/./") || strstr(tmp, "/../") || (n >= 2 && strcmp(tmp + n - 2, "/.") == 0) ||
        (n >= 3 && strcmp(tmp + n - 3, "/..") == 0))
        fallback(); /* normpath's cases: Python's */
    if ((size_t)snprintf(out, size, "%s/warren", strcmp(tmp, "/") == 0 ? "" : tmp) >= size)
        fallback();
}

static int same_namespaces(long pid)
{
    static const char *const kinds[] = {"net", "mnt", "user", "pid"};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        char theirs[64], ours[64], a[128], b[128];
        snprintf(theirs, sizeof theirs, "/proc/%ld/ns/%s", pid, kinds[i]);
        snprintf(ours, sizeof ours, "/proc/self/ns/%s", kinds[i]);
        ssize_t na = readlink(theirs, a, sizeof a), nb = readlink(ours, b, sizeof b);
        if (na <= 0 || na != nb || memcmp(a, b, (size_t)na) != 0)
            return 0;
    }
    return 1;
}

/* A verified connection to the running supervisor, or the Python CLI (which starts
   one, or explains why it cannot). */
static int supervisor(void)
{
    char root[PATH_MAX], path[PATH_MAX + 32];
    state_location(root, sizeof root);
    snprintf(path, sizeof path, "%s/sandboxes", root);
    if (!private_dir(root))
        fallback();
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        fallback();
    snprintf(path, sizeof path, "%s/supervisor.addr", root);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        fallback();
    char text[257];
    ssize_t n = -1;
    if (fstat(fd, &st) == 0 && st.st_uid == geteuid() && !(st.st_mode & 077))
        n = read(fd, text, 256);
    close(fd);
    if (n <= 0)
        fallback();
    text[n] = 0;
    char token[257], pid_text[257], extra[2];
    if (sscanf(text, "%256s %256s %1s", token, pid_text, extra) != 2)
        fallback();
    size_t tlen = strlen(token);
    if (tlen < 16 || tlen > 64)
        fallback();
    for (size_t i = 0; i < tlen; i++)
        if (!((token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'z') ||
              (token[i] >= 'A' && token[i] <= 'Z')))
            fallback();
    for (const char *p = pid_text; *p; p++)
        if (*p < '0' || *p > '9' || p - pid_text > 9)
            fallback();
    long pid = strtol(pid_text, NULL, 10);

    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        fallback();
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int len = snprintf(addr.sun_path + 1, sizeof addr.sun_path - 1, "warren-%s", token);
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
    if (connect(sock, (struct sockaddr *)&addr, alen) != 0 || !same_namespaces(pid))
        fallback();
    struct ucred cred;
    socklen_t clen = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != getuid())
        fallback(); /* the Python CLI says who answers there */
    return sock;
}

/* ---- the command's words back (peeked; consumed only when plain) ----------------- */

/* Past one JSON value at p (validity is the Python side's business: this only has to
   find where a value ends), or NULL. */
static const char *skip_value(const char *p, const char *end, int depth)
{
    if (p >= end || depth > 64)
        return NULL;
    if (*p == '"') {
        for (p++; p < end; p++) {
            if (*p == '\\')
                p++;
            else if (*p == '"')
                return p + 1;
        }
        return NULL;
    }
    if (*p == '[' || *p == '{') {
        char close = *p == '[' ? ']' : '}';
        p++;
        while (p < end && *p != close) {
            p = skip_value(p, end, depth + 1);
            if (p == NULL)
                return NULL;
            if (p < end && (*p == ',' || *p == ':'))
                p++;
        }
        return p < end ? p + 1 : NULL;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ':')
        p++;
    return p;
}

static int is(const char *v, const char *vend, const char *literal)
{
    size_t n = strlen(literal);
    return (size_t)(vend - v) == n && memcmp(v, literal, n) == 0;
}

/* A JSON string (from its opening quote to past its closing one) decoded into out, as
   UTF-8, as Python's json and then .encode(errors="replace") make it: a lone surrogate
   becomes '?'. Returns the length written, or -1 when it is not a string this side
   reads (then the Python CLI shows the message). */
static int hex4(const char *p, const char *end)
{
    int v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= c - '0';
        else if (c >= 'a' && c <= 'f')
            v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            v |= c - 'A' + 10;
        else
            return -1;
    }
    return v;
}

static int utf8(char *out, long cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static long json_string(const char *p, const char *end, char *out, size_t cap)
{
    size_t n = 0;
    if (p >= end || *p++ != '"')
        return -1;
    while (p < end && *p != '"') {
        if (cap - n < 8)
            return -1;
        if ((unsigned char)*p < 0x20)
            return -1;
        if (*p != '\\') {
            out[n++] = *p++;
            continue;
        }
        if (++p >= end)
            return -1;
        char e = *p++;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            long cp = hex4(p, end);
            if (cp < 0)
                return -1;
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                long lo = hex4(p + 2, end);
                if (lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
            }
            if (cp >= 0xD800 && cp <= 0xDFFF)
                out[n++] = '?';
            else
                n += (size_t)utf8(out + n, cp);
            break;
        }
        default:
            return -1;
        }
    }
    if (p >= end)
        return -1;
    return (long)n;
}

/* The strings of a JSON array of strings [v, vend), each as "warren: WARNING: TEXT\n"
   in out (what the Python CLI prints); the length, or -1 when it is not such an array. */
static long warning_lines(const char *v, const char *vend, char *out, size_t cap)
{
    static const char prefix[] = "warren: WARNING: ";
    size_t n = 0;
    const char *p = v;
    if (p >= vend || *p++ != '[')
        return -1;
    while (p < vend && *p != ']') {
        const char *q = skip_value(p, vend, 1);
        if (q == NULL || *p != '"' || cap - n < sizeof prefix + 1)
            return -1;
        memcpy(out + n, prefix, sizeof prefix - 1);
        n += sizeof prefix - 1;
        long got = json_string(p, q, out + n, cap - n - 1);
        if (got < 0)
            return -1;
        n += (size_t)got;
        out[n++] = '\n';
        p = q;
        if (p < vend && *p == ',')
            p++;
    }
    return p + 1 == vend ? (long)n : -1;
}

/* The next member of the JSON object at *p (past its `{` already): its key (quoted,
   klen long) and value [v, vend); *p moves past it and its comma. 1: a member; 0: the
   object's `}` is at *p; -1: not an object this can read. */
static int next_member(const char **p, const char *end, const char **key, size_t *klen, const char **v,
                       const char **vend)
{
    if (*p >= end)
        return -1;
    if (**p == '}')
        return 0;
    const char *kend = skip_value(*p, end, 0);
    if (kend == NULL || **p != '"' || kend >= end || *kend != ':')
        return -1;
    *key = *p;
    *klen = (size_t)(kend - *p);
    *v = kend + 1;
    *vend = skip_value(*v, end, 0);
    if (*vend == NULL)
        return -1;
    *p = *vend;
    if (*p < end && **p == ',')
        (*p)++;
    return 1;
}

#define KEY(name) (klen == sizeof(name) + 1 && memcmp(key + 1, name, sizeof(name) - 1) == 0)

/* Whether a message is the plain case the native side may take: a Started or an
   Exited of status 0, with no limit, no timeout, no field it does not know; its
   warnings (what the Python CLI would print of them) in warned, *warned_len long, and
   where their array is in the message (to take them out of a Started handed on). */
static int plain(const char *json, size_t n, int *exited, char *warned, size_t *warned_len,
                 size_t *w_at, size_t *w_end)
{
    const char *p = json, *end = json + n, *key, *v, *vend;
    size_t klen;
    int version = 0, kind = 0, status_zero = 0, more;
    char want[16];
    snprintf(want, sizeof want, "%d", WARREN_PROTOCOL);
    *warned_len = 0;
    *w_at = *w_end = 0;
    if (p >= end || *p++ != '{')
        return 0;
    while ((more = next_member(&p, end, &key, &klen, &v, &vend)) == 1) {
        if (KEY("v"))
            version = is(v, vend, want);
        else if (KEY("t"))
            kind = is(v, vend, "\"started\"") ? 1 : is(v, vend, "\"exited\"") ? 2 : -1;
        else if (KEY("warnings")) {
            long got = warning_lines(v, vend, warned, MAX_PEEK);
            if (got < 0)
                return 0;
            *warned_len = (size_t)got;
            *w_at = (size_t)(v - json);
            *w_end = (size_t)(vend - json);
        } else if (KEY("status"))
            status_zero = is(v, vend, "0");
        else if (KEY("timed_out")) {
            if (!is(v, vend, "false"))
                return 0;
        } else if (KEY("limit") || KEY("ask_name")) { /* asked on a terminal: the Python CLI's */
            if (!is(v, vend, "null"))
                return 0;
        } else if (!(KEY("pid") || KEY("cwd") || KEY("spawn_id") || KEY("network") || KEY("repository")))
            return 0;
    }
    if (more < 0 || p + 1 != end || !version)
        return 0;
    if (kind == 1) {
        *exited = 0;
        return 1;
    }
    if (kind == 2 && status_zero) {
        *exited = 1;
        return 1;
    }
    return 0;
}

static void write_all(int fd, const char *data, size_t len)
{
    for (size_t at = 0; at < len;) {
        ssize_t w = write(fd, data + at, len - at);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return; /* as the Python CLI: a write error to stdout or stderr is passed over */
        at += (size_t)w;
    }
}

/* The next message's frame, peeked (left unread) into frame, its JSON *jlen long at
   frame + 8: 1 when it is all there, with no payload and no descriptors; else 0; -1
   when the connection was reset with nothing to read. */
static int peek_frame(int sock, char *frame, uint32_t *jlen)
{
    unsigned char prefix[8];
    struct iovec iov = {.iov_base = prefix, .iov_len = sizeof prefix};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t got = recvmsg(sock, &msg, MSG_PEEK | MSG_DONTWAIT);
    if (got < 0 && errno == ECONNRESET)
        return -1; /* reset (this read took the error: the socket says nothing more) */
    if (got != (ssize_t)sizeof prefix || (msg.msg_flags & MSG_CTRUNC))
        return 0; /* short, closed, or descriptors attached */
    uint32_t plen;
    memcpy(jlen, prefix, 4);
    memcpy(&plen, prefix + 4, 4);
    *jlen = ntohl(*jlen);
    plen = ntohl(plen);
    if (*jlen == 0 || *jlen > MAX_PEEK - 8 || plen != 0)
        return 0;
    iov = (struct iovec){.iov_base = frame, .iov_len = 8 + *jlen};
    msg = (struct msghdr){.msg_iov = &iov, .msg_iovlen = 1};
    got = recvmsg(sock, &msg, MSG_PEEK | MSG_DONTWAIT);
    return got == (ssize_t)(8 + *jlen) && !(msg.msg_flags & MSG_CTRUNC);
}

/* The next message if it is plain (consumed, its JSON in out, its warnings printed
   as the Python CLI prints them, and taken out of it), else 0 (left unread); -1 when
   the connection was reset with nothing to read. */
static int take_plain(int sock, char *out, size_t *out_len, int *exited)
{
    static char frame[MAX_PEEK], warned[MAX_PEEK];
    size_t warned_len = 0, w_at = 0, w_end = 0;
    uint32_t jlen;
    int peeked = peek_frame(sock, frame, &jlen);
    if (peeked <= 0)
        return peeked;
    if (!plain(frame + 8, jlen, exited, warned, &warned_len, &w_at, &w_end))
        return 0;
    if (recv(sock, frame, 8 + jlen, MSG_DONTWAIT) != (ssize_t)(8 + jlen))
        return 0; /* cannot happen: it was all there */
    write_all(2, warned, warned_len);
    const char *json = frame + 8;
    if (w_end > w_at) {
        /* printed: a Started handed on to the Python CLI later holds none */
        memcpy(out, json, w_at);
        memcpy(out + w_at, "[]", 2);
        memcpy(out + w_at + 2, json + w_end, jlen - w_end);
        *out_len = w_at + 2 + (jlen - w_end);
    } else {
        memcpy(out, json, jlen);
        *out_len = jlen;
    }
    return 1;
}

/* ---- the request -------------------------------------------------------------------- */

static int plain_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
            return 0;
    }
    return 1;
}

static int open_fd(int fd)
{
    return fcntl(fd, F_GETFD) >= 0;
}

static const int FORWARD[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

/* An --allow-host value the Python CLI would send as it is and the supervisor reads as
   a plain name or address: letters, digits, '.', '-', '*', and an optional :PORT. Any
   other (brackets, a space, a typo) is the Python CLI's to send and to explain. */
static int plain_host(const char *h)
{
    size_t n = 0;
    while (h[n] != 0 && h[n] != ':') {
        char c = h[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '-' || c == '*'))
            return 0;
        n++;
    }
    if (n == 0 || n > 253 || h[0] == '-')
        return 0;
    if (h[n] == 0)
        return 1;
    size_t digits = strlen(h + n + 1);
    if (digits == 0 || digits > 5)
        return 0;
    for (size_t i = n + 1; h[i] != 0; i++)
        if (h[i] < '0' || h[i] > '9')
            return 0;
    return 1;
}

/* A --preset value as the Python CLI sends it: a lowercase word (an unknown one is the
   supervisor's to name, for both). */
static int plain_word(const char *w)
{
    size_t n = strlen(w);
    if (n == 0 || n > 64 || !(w[0] >= 'a' && w[0] <= 'z'))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((w[i] >= 'a' && w[i] <= 'z') || (w[i] >= '0' && w[i] <= '9') || w[i] == '-' || w[i] == '_'))
            return 0;
    return 1;
}

/* A flag of `run` taken here, as `--flag VALUE` or `--flag=VALUE`: its value, moving *i
   past it; NULL when argv[*i] is not that flag. A missing value is the Python CLI's. */
static const char *flag_value(char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0)
        return NULL;
    if (argv[*i][n] == '=') {
        return argv[(*i)++] + n + 1;
    }
    if (argv[*i][n] != 0)
        return NULL;
    if (argv[*i + 1] == NULL)
        fallback();
    *i += 2;
    return argv[*i - 1];
}

/* A path given to --workspace, --write, --read or --deny: sent as written (the
   supervisor resolves it against the caller's directory, as for the Python CLI); one
   argparse would not take as a value (empty, or like a flag) is the Python CLI's. */
static const char *path_value(const char *v)
{
    if (v == NULL || v[0] == 0 || v[0] == '-')
        fallback();
    return v;
}

/* A spec's next key: its name, after a comma unless it is the first. */
static void spec_key(struct buf *b, int *keys, const char *name)
{
    if ((*keys)++)
        put(b, ",", 1);
    put_string(b, name, strlen(name));
    put(b, ":", 1);
}

/* A --env NAME=VALUE, as the Python CLI takes it (flags.pairs): a NAME before the first
   `=`, not empty (else the Python CLI's usage error); a NAME given again keeps its first
   place and takes the later value, as a dict does. */
static void add_env(const char **envs, int *n, const char *pair)
{
    const char *eq = strchr(pair, '=');
    if (eq == NULL || eq == pair)
        fallback();
    size_t key = (size_t)(eq - pair);
    for (int j = 0; j < *n; j++)
        if (strncmp(envs[j], pair, key + 1) == 0) {
            envs[j] = pair;
            return;
        }
    envs[(*n)++] = pair;
}

/* Whether a network event (one JSON line of net/log.py, a flat object whose keys are
   warren's) is an allowed request, which the Python CLI passes over without a word. A
   quote inside a string value is always escaped, so `"allowed":true` after `{` or `,`
   is that key. Anything else (a refusal, a policy record, a line not understood) is not. */
static int allowed_line(const char *line, size_t len)
{
    static const char key[] = "\"allowed\":true";
    size_t k = sizeof key - 1;
    if (len < k + 2 || line[0] != '{')
        return 0;
    for (size_t i = 1; i + k <= len; i++)
        if ((line[i - 1] == '{' || line[i - 1] == ',') && memcmp(line + i, key, k) == 0 &&
            (line[i + k] == ',' || line[i + k] == '}'))
            return 1;
    return 0;
}

/* Consumes the allowed requests waiting on the network events' socket. DROPPED: nothing
   else waits; PARTIAL: only the start of a line (its writer is still writing it); SHOW:
   something else (a refusal, a line not understood, an error), left there for the
   Python CLI, which then reads the channel as it would its own. */
enum { SHOW, DROPPED, PARTIAL };

static int drop_allowed(int fd)
{
    static char peek[MAX_PEEK];
    for (;;) {
        ssize_t n = recv(fd, peek, sizeof peek, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? DROPPED : SHOW;
        if (n == 0)
            return DROPPED;
        size_t done = 0;
        for (;;) {
            const char *nl = memchr(peek + done, '\n', (size_t)n - done);
            if (nl == NULL || !allowed_line(peek + done, (size_t)(nl - (peek + done))))
                break;
            done = (size_t)(nl - peek) + 1;
        }
        if (done > 0 && recv(fd, peek, done, MSG_DONTWAIT) != (ssize_t)done)
            return SHOW;
        if (done == (size_t)n)
            continue; /* all passed over: more may wait beyond what was peeked */
        if (memchr(peek + done, '\n', (size_t)n - done) != NULL)
            return SHOW; /* a whole line that is not an allowed request */
        if ((size_t)n < sizeof peek)
            return PARTIAL;
        if (done == 0)
            return SHOW; /* a line longer than a peek: not one of warren's */
        /* the end of what was peeked cut a line, after whole ones: look again */
    }
}

/* Whether the reply to a create, stop or rm -f is the plain case: the sandbox NAME (as
   asked), whatever else it says of it; its warnings (what the Python CLI prints of
   them) in warned. */
static int plain_info(const char *json, size_t n, const char *name, char *warned, size_t *warned_len)
{
    const char *p = json, *end = json + n, *key, *v, *vend;
    size_t klen;
    int version = 0, kind = 0, named = 0, more;
    char want[16], quoted[80];
    snprintf(want, sizeof want, "%d", WARREN_PROTOCOL);
    snprintf(quoted, sizeof quoted, "\"%s\"", name); /* a plain name needs no escape */
    *warned_len = 0;
    if (p >= end || *p++ != '{')
        return 0;
    while ((more = next_member(&p, end, &key, &klen, &v, &vend)) == 1) {
        if (KEY("v"))
            version = is(v, vend, want);
        else if (KEY("t"))
            kind = is(v, vend, "\"sandbox\"");
        else if (KEY("name"))
            named = is(v, vend, quoted);
        else if (KEY("warnings")) {
            long got = warning_lines(v, vend, warned, MAX_PEEK);
            if (got < 0)
                return 0;
            *warned_len = (size_t)got;
        } /* the rest (its id, state, workspace...): the Python CLI prints none of it */
    }
    return more == 0 && p + 1 == end && version && kind && named;
}
#undef KEY

/* The one reply of a create, stop or rm -f: when plain, its warnings printed as the
   Python CLI prints them, and a create's name; anything else (an error, a signal
   meanwhile, a reply not all there) is the Python CLI's to read on the same connection
   (attach.handed_reply). */
static void __attribute__((noreturn)) answered(int sock, int sigfd, const char *name, int print_name)
{
    struct pollfd pfd[2] = {{.fd = sock, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
    for (;;) {
        int ready = poll(pfd, 2, -1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0 || (pfd[1].revents & POLLIN))
            resume(sock, -1, "", 0);
        if (pfd[0].revents)
            break;
    }
    static char frame[MAX_PEEK], warned[MAX_PEEK];
    uint32_t jlen;
    size_t warned_len = 0;
    int peeked = peek_frame(sock, frame, &jlen);
    if (peeked < 0) /* never read: sent again, to the next supervisor */
        resume(sock, -1, UNTAKEN, strlen(UNTAKEN));
    if (peeked == 0 || !plain_info(frame + 8, jlen, name, warned, &warned_len))
        resume(sock, -1, "", 0);
    write_all(2, warned, warned_len);
    if (print_name) {
        write_all(1, name, strlen(name));
        write_all(1, "\n", 1);
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    g_argv = argv;
    /* Only `run [-w|--workspace DIR] [--write PATH]... [--read PATH]... [--deny PATH]...
       [--network MODE] [--allow-host HOST]... [--preset NAME]... [--env K=V]... [--] CMD...`
       and `exec [--cwd DIR] NAME [--] CMD...`, with stdio that is no terminal, and
       `create [the same flags as run] NAME`, `stop NAME` and `rm -f NAME`. */
    if (argc < 3 || getenv("WARREN_NATIVE_RESUME") != NULL)
        fallback();
    int run = strcmp(argv[1], "run") == 0, create = strcmp(argv[1], "create") == 0;
    int stop = strcmp(argv[1], "stop") == 0 && argc == 3;
    int rm = strcmp(argv[1], "rm") == 0 && argc == 4 && (strcmp(argv[2], "-f") == 0 || strcmp(argv[2], "--force") == 0);
    char **command = NULL, *name = NULL;
    const char *network = NULL, *workspace = NULL, *exec_cwd = NULL;
    const char **hosts = NULL, **presets = NULL, **envs = NULL, **writes = NULL, **reads = NULL, **denies = NULL;
    int nhosts = 0, npresets = 0, nenvs = 0, nwrites = 0, nreads = 0, ndenies = 0;
    if (stop || rm) {
        name = argv[argc - 1];
        if (!plain_name(name))
            fallback();
    } else if (run || create) {
        int i = 2;
        hosts = calloc((size_t)argc, sizeof *hosts);
        presets = calloc((size_t)argc, sizeof *presets);
        envs = calloc((size_t)argc, sizeof *envs);
        writes = calloc((size_t)argc, sizeof *writes);
        reads = calloc((size_t)argc, sizeof *reads);
        denies = calloc((size_t)argc, sizeof *denies);
        if (hosts == NULL || presets == NULL || envs == NULL || writes == NULL || reads == NULL || denies == NULL)
            fallback();
        while (argv[i] != NULL && argv[i][0] == '-' && strcmp(argv[i], "--") != 0) {
            const char *v = NULL;
            if ((v = flag_value(argv, &i, "--network")) != NULL) {
                /* ask asks on the terminal: the Python CLI's; a second --network too */
                if (network != NULL || !(strcmp(v, "none") == 0 || strcmp(v, "allow") == 0 || strcmp(v, "open") == 0))
                    fallback();
                network = v;
            } else if ((v = flag_value(argv, &i, "--allow-host")) != NULL) {
                if (!plain_host(v))
                    fallback();
                hosts[nhosts++] = v;
            } else if ((v = flag_value(argv, &i, "--preset")) != NULL) {
                if (!plain_word(v))
                    fallback();
                presets[npresets++] = v;
            } else if ((v = flag_value(argv, &i, "--env")) != NULL) {
                add_env(envs, &nenvs, v);
            } else if ((v = flag_value(argv, &i, "--write")) != NULL) {
                writes[nwrites++] = path_value(v);
            } else if ((v = flag_value(argv, &i, "--read")) != NULL) {
                reads[nreads++] = path_value(v);
            } else if ((v = flag_value(argv, &i, "--deny")) != NULL) {
                denies[ndenies++] = path_value(v);
            } else if (strcmp(argv[i], "-w") == 0 || (v = flag_value(argv, &i, "--workspace")) != NULL) {
                if (v == NULL) { /* -w DIR only: argparse's -wDIR and -w=DIR are the Python CLI's */
                    v = argv[i + 1];
                    i += 2;
                }
                if (workspace != NULL) /* given twice: argparse keeps the last; the Python CLI's */
                    fallback();
                workspace = path_value(v);
            } else {
                fallback();
            }
        }
        if (argv[i] == NULL)
            fallback();
        if (create) {
            /* NAME alone after the flags (`--`, a flag after it: the Python CLI's) */
            name = argv[i];
            if (!plain_name(name) || argv[i + 1] != NULL)
                fallback();
        } else if (strcmp(argv[i], "--") == 0)
            command = argv + i + 1;
        else
            command = argv + i;
    } else if (strcmp(argv[1], "exec") == 0) {
        int i = 2;
        while (argv[i] != NULL && argv[i][0] == '-') { /* --cwd DIR before NAME; any other flag is Python's */
            const char *v = flag_value(argv, &i, "--cwd");
            if (v == NULL || exec_cwd != NULL)
                fallback();
            exec_cwd = path_value(v);
        }
        name = argv[i];
        if (name == NULL || !plain_name(name) || argv[i + 1] == NULL)
            fallback();
        command = argv + i + 1;
        if (strcmp(command[0], "--") == 0) {
            command++;
            if (command[0] != NULL && strcmp(command[0], "--") == 0)
                command++;
        } else if (command[0][0] == '-') {
            fallback();
        }
    } else {
        fallback();
    }
    if (create || stop || rm) {
        if (!open_fd(1) || !open_fd(2)) /* it prints: the Python CLI's, where it cannot */
            fallback();
    } else {
        if (command[0] == NULL)
            fallback();
        for (int fd = 0; fd < 3; fd++)
            if (!open_fd(fd) || isatty(fd))
                fallback();
    }

    struct buf req = {0};
    char head[64];
    snprintf(head, sizeof head, "{\"v\":%d,\"t\":\"%s\",", WARREN_PROTOCOL, rm ? "stop" : argv[1]);
    puts_(&req, head);
    if (stop || rm) {
        puts_(&req, "\"name\":");
        put_string(&req, name, strlen(name));
        puts_(&req, rm ? ",\"remove\":true}" : ",\"remove\":false}");
    } else if (run || create) {
        if (!coerce_c_locale())
            fallback();
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            fallback();
        if (create) {
            puts_(&req, "\"name\":");
            put_string(&req, name, strlen(name));
            puts_(&req, ",");
        }
        puts_(&req, "\"spec\":{");
        int keys = 0; /* in the order of flags.spec_of */
        if (workspace != NULL) {
            spec_key(&req, &keys, "workspace");
            put_string(&req, workspace, strlen(workspace));
        }
        const struct {
            const char *key;
            const char **items;
            int n;
        } lists[] = {{"write", writes, nwrites}, {"read", reads, nreads}, {"deny", denies, ndenies},
                     {"preset", presets, npresets}, {"allow_host", hosts, nhosts}};
        for (size_t k = 0; k < sizeof lists / sizeof *lists; k++)
            if (lists[k].n > 0) {
                spec_key(&req, &keys, lists[k].key);
                put_list(&req, lists[k].items, lists[k].n);
            }
        if (nenvs > 0) {
            spec_key(&req, &keys, "env");
            put_pairs(&req, envs, nenvs);
        }
        if (network != NULL) {
            spec_key(&req, &keys, "network");
            put_string(&req, network, strlen(network));
        }
        puts_(&req, "},\"caller\":{\"cwd\":");
        put_string(&req, cwd, strlen(cwd));
        puts_(&req, ",\"env\":");
        put_environ(&req);
        puts_(&req, ",\"config\":true}");
        if (run) {
            puts_(&req, ",\"command\":{\"argv\":");
            put_argv(&req, command);
            puts_(&req, ",\"stdio\":[true,true,true]},\"net_events\":true}");
        } else {
            puts_(&req, "}");
        }
    } else {
        puts_(&req, "\"sandbox\":");
        put_string(&req, name, strlen(name));
        puts_(&req, ",\"command\":{\"argv\":");
        put_argv(&req, command);
        if (exec_cwd != NULL) {
            puts_(&req, ",\"cwd\":");
            put_string(&req, exec_cwd, strlen(exec_cwd));
        }
        puts_(&req, ",\"stdio\":[true,true,true]},\"origin\":\"cli\"}");
    }
    size_t jlen = req.len;
    if (jlen > 4 * 1024 * 1024)
        fallback(); /* wire.MAX_HEADER: the Python CLI explains */

    int sock = supervisor();
    /* The network events' channel: a socket, not a pipe, so that what waits can be peeked
       at (drop_allowed) and left for the Python CLI. It only reads from it, as from a pipe. */
    int net[2] = {-1, -1};
    if (run && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, net) != 0)
        fallback();

    /* From here on, signals wait in the queue: read here through a signalfd, or left
       pending for the Python CLI if it takes over. */
    sigset_t mask;
    sigemptyset(&mask);
    for (size_t i = 0; i < sizeof FORWARD / sizeof *FORWARD; i++)
        sigaddset(&mask, FORWARD[i]);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sigfd = signalfd(-1, &mask, SFD_CLOEXEC);

    uint32_t lens[2] = {htonl((uint32_t)jlen), 0};
    struct iovec iov[2] = {{.iov_base = lens, .iov_len = 8}, {.iov_base = req.data, .iov_len = jlen}};
    int fds[4] = {0, 1, 2, net[1]};
    int nfds = run ? 4 : (create || stop || rm) ? 0 : 3;
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof fds)];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control.space,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    if (nfds == 0) { /* a create's, stop's or rm's request carries no descriptors */
        msg.msg_control = NULL;
        msg.msg_controllen = 0;
    }
    size_t total = 8 + jlen, sent = 0;
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR)
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    sent = n < 0 ? 0 : (size_t)n;
    while (n >= 0 && sent < total) {
        const char *from = sent < 8 ? (const char *)lens + sent : req.data + (sent - 8);
        size_t left = sent < 8 ? 8 - sent : total - sent;
        n = send(sock, from, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            n = 0;
        else if (n > 0)
            sent += (size_t)n;
    }
    if (n < 0) /* closed on us (its answer may be there to read), or worse: the Python CLI says */
        resume(sock, net[0], "", 0);
    if (run)
        close(net[1]);
    if (create || stop || rm)
        answered(sock, sigfd, name, create);

    static char started[MAX_PEEK];
    size_t started_len = 0;
    struct pollfd pfd[3] = {{.fd = sock, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}, {.fd = net[0], .events = POLLIN}};
    int partial = 0;
    for (;;) {
        pfd[2].events = partial ? 0 : POLLIN;
        int ready = poll(pfd, run ? 3 : 2, partial ? 1 : -1);
        if (ready == 0)
            pfd[2].revents = POLLIN; /* a moment passed: the line's end, if it came */
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            resume(sock, net[0], started, started_len);
        }
        if (pfd[1].revents & POLLIN) {
            /* The Python CLI forwards the signal (still pending for it), and the rest. */
            resume(sock, net[0], started, started_len);
        }
        if (run && pfd[2].revents) {
            int ended = (pfd[2].revents & (POLLHUP | POLLERR)) != 0;
            int left = drop_allowed(net[0]);
            /* a network event to show, or the start of one whose end will never come */
            if (left == SHOW || (left == PARTIAL && ended))
                resume(sock, net[0], started, started_len);
            /* the start of a line: its end is being written; look again in a moment */
            partial = left == PARTIAL;
            if (left == DROPPED && ended)
                pfd[2].fd = -1; /* the supervisor closed it: nothing more will come */
        }
        if (pfd[0].revents) {
            char json[MAX_PEEK];
            size_t len = 0;
            int exited = 0;
            if (run && net[0] >= 0 && drop_allowed(net[0]) != DROPPED)
                resume(sock, net[0], started, started_len);
            int took = take_plain(sock, json, &len, &exited);
            if (took < 0 && started_len == 0)
                /* Reset before any word: the supervisor went away without reading the
                   request (nothing ran). The Python CLI sends it again, to the next one. */
                resume(sock, net[0], UNTAKEN, strlen(UNTAKEN));
            if (took <= 0)
                resume(sock, net[0], started, started_len);
            if (exited)
                _exit(0);
            memcpy(started, json, len);
            started_len = len;
        }
    }
}
