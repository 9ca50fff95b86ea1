/*
 * LD_PRELOAD fault and trace shim for the dsh sessions test harness (test support, never loaded in production).
 *
 * Built by dsh.session_persistence.testing's shim builder with the machine's C compiler into a temporary
 * directory and preloaded into a child process. Everything is driven by environment variables, re-read on
 * every intercepted call (Python's os.environ updates the C environment, so a child can arm and heal faults
 * between its own calls):
 *
 *   DSH_SHIM_FAULT   rules separated by '|'; each rule is ';'-separated key=value pairs:
 *                      op=write,fsync,...  which calls count: write pwrite fsync fdatasync ftruncate link rename
 *                                          unlink dirfsync (an fsync/fdatasync whose descriptor is a directory;
 *                                          plain fsync/fdatasync never match a directory)
 *                      path=SUBSTRING      only calls on a path containing it (descriptors resolved via /proc)
 *                      nth=N               the first matching call to fail (1-based, default 1)
 *                      count=C             how many consecutive matching calls fail from there (default 1,
 *                                          0 = every later one)
 *                      errno=EIO|ENOSPC|N  the error (default EIO)
 *                      after=1             perform the real call first, then fail ("it landed, the call failed")
 *                      pause=PATH          do not fail: create PATH.paused, wait until PATH exists, then run the
 *                                          call (a deterministic point inside a primitive for the caller to act)
 *                    A rule's counter restarts whenever the DSH_SHIM_FAULT text changes.
 *   DSH_SHIM_RECORD  path of a trace file: every write/pwrite/fsync/fdatasync/ftruncate/link/rename/unlink and
 *                    every creating or truncating open on a path under one of DSH_SHIM_RECORD_UNDER
 *                    (':'-separated prefixes) is appended as one record (see _crash_trace.py for the format).
 *   DSH_SHIM_LOG     path of a file that gets one line per injected fault (what failed, where).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_RULES 8
#define MAX_SPEC 4096

enum op_bits {
    OP_WRITE = 1 << 0,
    OP_PWRITE = 1 << 1,
    OP_FSYNC = 1 << 2,
    OP_FDATASYNC = 1 << 3,
    OP_FTRUNCATE = 1 << 4,
    OP_LINK = 1 << 5,
    OP_RENAME = 1 << 6,
    OP_UNLINK = 1 << 7,
    OP_DIRFSYNC = 1 << 8,
};

struct rule {
    unsigned ops;
    char path[PATH_MAX];
    long nth;
    long count;
    int err;
    int after;
    char pause[PATH_MAX];
    long seen;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char spec_cache[MAX_SPEC];
static int spec_loaded;
static struct rule rules[MAX_RULES];
static int n_rules;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off_t);
static int (*real_link)(const char *, const char *);
static int (*real_linkat)(int, const char *, int, const char *, int);
static int (*real_rename)(const char *, const char *);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned);
static int (*real_unlink)(const char *);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_openat64)(int, const char *, int, ...);

#define RESOLVE(name)                                                    \
    do {                                                                 \
        if (!real_##name) *(void **)(&real_##name) = dlsym(RTLD_NEXT, #name); \
    } while (0)

static unsigned op_of(const char *name, size_t len) {
    static const struct { const char *name; unsigned bit; } table[] = {
        {"write", OP_WRITE}, {"pwrite", OP_PWRITE}, {"fsync", OP_FSYNC}, {"fdatasync", OP_FDATASYNC},
        {"ftruncate", OP_FTRUNCATE}, {"link", OP_LINK}, {"rename", OP_RENAME}, {"unlink", OP_UNLINK},
        {"dirfsync", OP_DIRFSYNC},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strlen(table[i].name) == len && strncmp(table[i].name, name, len) == 0) return table[i].bit;
    return 0;
}

static int errno_of(const char *value) {
    if (strcmp(value, "EIO") == 0) return EIO;
    if (strcmp(value, "ENOSPC") == 0) return ENOSPC;
    if (strcmp(value, "EDQUOT") == 0) return EDQUOT;
    if (strcmp(value, "EROFS") == 0) return EROFS;
    int n = atoi(value);
    return n > 0 ? n : EIO;
}

static void parse_rule(char *text, struct rule *rule) {
    memset(rule, 0, sizeof *rule);
    rule->nth = 1;
    rule->count = 1;
    rule->err = EIO;
    for (char *save = NULL, *pair = strtok_r(text, ";", &save); pair; pair = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(pair, '=');
        if (!eq) continue;
        *eq = '\0';
        const char *key = pair, *value = eq + 1;
        if (strcmp(key, "op") == 0) {
            const char *p = value;
            while (*p) {
                size_t len = strcspn(p, ",");
                rule->ops |= op_of(p, len);
                p += len;
                if (*p == ',') p++;
            }
        } else if (strcmp(key, "path") == 0) {
            snprintf(rule->path, sizeof rule->path, "%s", value);
        } else if (strcmp(key, "nth") == 0) {
            rule->nth = atol(value);
        } else if (strcmp(key, "count") == 0) {
            rule->count = atol(value);
        } else if (strcmp(key, "errno") == 0) {
            rule->err = errno_of(value);
        } else if (strcmp(key, "after") == 0) {
            rule->after = atoi(value);
        } else if (strcmp(key, "pause") == 0) {
            snprintf(rule->pause, sizeof rule->pause, "%s", value);
        }
    }
}

/* Called with the lock held: reparse when the spec text changed (restarting every counter). */
static void load_rules(void) {
    const char *spec = getenv("DSH_SHIM_FAULT");
    if (!spec) spec = "";
    if (spec_loaded && strncmp(spec, spec_cache, sizeof spec_cache) == 0) return;
    snprintf(spec_cache, sizeof spec_cache, "%s", spec);
    spec_loaded = 1;
    n_rules = 0;
    char copy[MAX_SPEC];
    snprintf(copy, sizeof copy, "%s", spec);
    for (char *save = NULL, *text = strtok_r(copy, "|", &save); text && n_rules < MAX_RULES;
         text = strtok_r(NULL, "|", &save)) {
        parse_rule(text, &rules[n_rules]);
        if (rules[n_rules].ops) n_rules++;
    }
}

static void fd_path(int fd, char *out, size_t size) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, size - 1);
    out[n < 0 ? 0 : n] = '\0';
}

static void log_fault(const char *what, const char *path, int err, int after) {
    const char *log = getenv("DSH_SHIM_LOG");
    if (!log || !*log) return;
    RESOLVE(open);
    RESOLVE(write);
    int fd = real_open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return;
    char line[PATH_MAX + 128];
    int n = snprintf(line, sizeof line, "%s %s errno=%d after=%d\n", what, path, err, after);
    if (n > 0) real_write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    close(fd);
}

/* Announce the pause (PATH.paused), then wait for PATH to exist. Runs without the lock held. */
static void pause_until(const char *release) {
    RESOLVE(open);
    char announce[PATH_MAX + 16];
    snprintf(announce, sizeof announce, "%s.paused", release);
    int fd = real_open(announce, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    while (access(release, F_OK) != 0) usleep(1000);
}

/* 0: run normally; otherwise the errno to fail with (*after set when the real call must run first). */
static int planned_fault(unsigned op, const char *path, const char *what, int *after) {
    const char *spec = getenv("DSH_SHIM_FAULT");
    if (!spec || !*spec) {
        if (!spec_loaded || spec_cache[0]) {
            pthread_mutex_lock(&lock);
            load_rules();
            pthread_mutex_unlock(&lock);
        }
        return 0;
    }
    int err = 0;
    char release[PATH_MAX];
    release[0] = '\0';
    pthread_mutex_lock(&lock);
    load_rules();
    for (int i = 0; i < n_rules && !err && !release[0]; i++) {
        struct rule *rule = &rules[i];
        if (!(rule->ops & op)) continue;
        if (rule->path[0] && !strstr(path, rule->path)) continue;
        rule->seen++;
        if (rule->seen >= rule->nth && (rule->count == 0 || rule->seen < rule->nth + rule->count)) {
            if (rule->pause[0]) {
                snprintf(release, sizeof release, "%s", rule->pause);
            } else {
                err = rule->err;
                *after = rule->after;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    if (release[0]) {
        pause_until(release);
        return 0;
    }
    if (err) log_fault(what, path, err, *after);
    return err;
}

/* ------------------------------------------------------------------------------------------------------------
 * Trace recording. One record per call, a text line then the raw bytes it announces:
 *   "<op> <ino> <arg> <len> <plen> <p2len>\n" <path (plen bytes)> <second path (p2len bytes)> <data (len bytes)>
 * op: W (write at offset arg), T (truncate to arg), S (fsync/fdatasync of a file), D (fsync of a directory),
 * C (creating open; arg 1 when O_TRUNC), L (link path -> path2), R (rename path -> path2), U (unlink path).
 * ino is the inode the call acted on (for L, R and U: the inode of the source name before the call).
 */

static int recording(const char *path) {
    const char *trace = getenv("DSH_SHIM_RECORD");
    const char *under = getenv("DSH_SHIM_RECORD_UNDER");
    if (!trace || !*trace || !under || !*under || !path || !*path) return 0;
    const char *p = under;
    while (*p) {
        size_t len = strcspn(p, ":");
        if (len && strncmp(path, p, len) == 0) return 1;
        p += len;
        if (*p == ':') p++;
    }
    return 0;
}

static void put_all(int fd, const void *data, size_t len) {
    const char *p = data;
    while (len) {
        ssize_t n = real_write(fd, p, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            return;
        }
        p += n;
        len -= (size_t)n;
    }
}

static void record(char op, unsigned long long ino, long long arg, const void *data, size_t len, const char *path,
                   const char *path2) {
    int saved = errno;
    RESOLVE(open);
    RESOLVE(write);
    size_t plen = path ? strlen(path) : 0, p2len = path2 ? strlen(path2) : 0;
    char head[160];
    int n = snprintf(head, sizeof head, "%c %llu %lld %zu %zu %zu\n", op, ino, arg, len, plen, p2len);
    pthread_mutex_lock(&lock);
    int fd = real_open(getenv("DSH_SHIM_RECORD"), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
        put_all(fd, head, (size_t)n);
        if (plen) put_all(fd, path, plen);
        if (p2len) put_all(fd, path2, p2len);
        if (len) put_all(fd, data, len);
        close(fd);
    }
    pthread_mutex_unlock(&lock);
    errno = saved;
}

static unsigned long long fd_ino(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

static unsigned long long path_ino(int dirfd, const char *path) {
    struct stat st;
    return fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 ? (unsigned long long)st.st_ino : 0;
}

static int fd_is_dir(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
}

/* An absolute path for (dirfd, path) as the caller named it (not resolved: the layout's own names). */
static void abs_path(int dirfd, const char *path, char *out, size_t size) {
    if (!path) {
        out[0] = '\0';
        return;
    }
    if (path[0] == '/') {
        snprintf(out, size, "%s", path);
        return;
    }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base)) base[0] = '\0';
    } else {
        fd_path(dirfd, base, sizeof base);
    }
    snprintf(out, size, "%s/%s", base, path);
}

/* ------------------------------------------------------------------------------------------------------------
 * Interposed calls */

static ssize_t do_write(int fd, const void *buf, size_t count, int positional, off_t offset, int use64) {
    char path[PATH_MAX];
    fd_path(fd, path, sizeof path);
    int after = 0;
    int err = planned_fault(positional ? OP_PWRITE : OP_WRITE, path, positional ? "pwrite" : "write", &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    ssize_t n;
    if (positional) {
        n = use64 ? real_pwrite64(fd, buf, count, offset) : real_pwrite(fd, buf, count, offset);
    } else {
        n = real_write(fd, buf, count);
    }
    if (n > 0 && recording(path)) {
        long long at = positional ? (long long)offset : (long long)lseek(fd, 0, SEEK_CUR) - n;
        record('W', fd_ino(fd), at, buf, (size_t)n, path, NULL);
    }
    if (err) {
        errno = err;
        return -1;
    }
    return n;
}

ssize_t write(int fd, const void *buf, size_t count) {
    RESOLVE(write);
    if (fd <= 2) return real_write(fd, buf, count);
    return do_write(fd, buf, count, 0, 0, 0);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    RESOLVE(pwrite);
    return do_write(fd, buf, count, 1, offset, 0);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    RESOLVE(pwrite64);
    return do_write(fd, buf, count, 1, offset, 1);
}

static int do_sync(int fd, int data_only) {
    char path[PATH_MAX];
    fd_path(fd, path, sizeof path);
    int dir = fd_is_dir(fd);
    unsigned op = dir ? OP_DIRFSYNC : (data_only ? OP_FDATASYNC : OP_FSYNC);
    int after = 0;
    int err = planned_fault(op, path, dir ? "dirfsync" : (data_only ? "fdatasync" : "fsync"), &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    int rc = data_only ? real_fdatasync(fd) : real_fsync(fd);
    if (rc == 0 && recording(path)) record(dir ? 'D' : 'S', fd_ino(fd), 0, NULL, 0, path, NULL);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

int fsync(int fd) {
    RESOLVE(fsync);
    return do_sync(fd, 0);
}

int fdatasync(int fd) {
    RESOLVE(fdatasync);
    return do_sync(fd, 1);
}

static int do_ftruncate(int fd, off_t length, int use64) {
    char path[PATH_MAX];
    fd_path(fd, path, sizeof path);
    int after = 0;
    int err = planned_fault(OP_FTRUNCATE, path, "ftruncate", &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    int rc = use64 ? real_ftruncate64(fd, length) : real_ftruncate(fd, length);
    if (rc == 0 && recording(path)) record('T', fd_ino(fd), (long long)length, NULL, 0, path, NULL);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

int ftruncate(int fd, off_t length) {
    RESOLVE(ftruncate);
    return do_ftruncate(fd, length, 0);
}

int ftruncate64(int fd, off_t length) {
    RESOLVE(ftruncate64);
    return do_ftruncate(fd, length, 1);
}

static int do_link(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags, int at) {
    char from[PATH_MAX], to[PATH_MAX];
    abs_path(olddirfd, oldpath, from, sizeof from);
    abs_path(newdirfd, newpath, to, sizeof to);
    int after = 0;
    int err = planned_fault(OP_LINK, to, "link", &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    unsigned long long ino = path_ino(olddirfd, oldpath);
    int rc = at ? real_linkat(olddirfd, oldpath, newdirfd, newpath, flags) : real_link(oldpath, newpath);
    if (rc == 0 && recording(to)) record('L', ino, 0, NULL, 0, from, to);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

int link(const char *oldpath, const char *newpath) {
    RESOLVE(link);
    return do_link(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0, 0);
}

int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags) {
    RESOLVE(linkat);
    return do_link(olddirfd, oldpath, newdirfd, newpath, flags, 1);
}

static int do_rename(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags, int kind) {
    char from[PATH_MAX], to[PATH_MAX];
    abs_path(olddirfd, oldpath, from, sizeof from);
    abs_path(newdirfd, newpath, to, sizeof to);
    int after = 0;
    int err = planned_fault(OP_RENAME, to, "rename", &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    unsigned long long ino = path_ino(olddirfd, oldpath);
    int rc;
    if (kind == 0)
        rc = real_rename(oldpath, newpath);
    else if (kind == 1)
        rc = real_renameat(olddirfd, oldpath, newdirfd, newpath);
    else
        rc = real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    if (rc == 0 && recording(to)) record('R', ino, 0, NULL, 0, from, to);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

int rename(const char *oldpath, const char *newpath) {
    RESOLVE(rename);
    return do_rename(AT_FDCWD, oldpath, AT_FDCWD, newpath, 0, 0);
}

int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    RESOLVE(renameat);
    return do_rename(olddirfd, oldpath, newdirfd, newpath, 0, 1);
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags) {
    RESOLVE(renameat2);
    return do_rename(olddirfd, oldpath, newdirfd, newpath, flags, 2);
}

static int do_unlink(int dirfd, const char *path, int flags, int at) {
    char full[PATH_MAX];
    abs_path(dirfd, path, full, sizeof full);
    int after = 0;
    int err = planned_fault(OP_UNLINK, full, "unlink", &after);
    if (err && !after) {
        errno = err;
        return -1;
    }
    unsigned long long ino = path_ino(dirfd, path);
    int rc = at ? real_unlinkat(dirfd, path, flags) : real_unlink(path);
    if (rc == 0 && !(flags & AT_REMOVEDIR) && recording(full)) record('U', ino, 0, NULL, 0, full, NULL);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

int unlink(const char *path) {
    RESOLVE(unlink);
    return do_unlink(AT_FDCWD, path, 0, 0);
}

int unlinkat(int dirfd, const char *path, int flags) {
    RESOLVE(unlinkat);
    return do_unlink(dirfd, path, flags, 1);
}

/* Opens are never failed, only traced when they may create or truncate a file. */
static int traced_open(int fd, int dirfd, const char *path, int flags) {
    if (fd < 0 || !(flags & (O_CREAT | O_TRUNC))) return fd;
    char full[PATH_MAX];
    abs_path(dirfd, path, full, sizeof full);
    if (recording(full) && !fd_is_dir(fd)) record('C', fd_ino(fd), (flags & O_TRUNC) ? 1 : 0, NULL, 0, full, NULL);
    return fd;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...) {
    RESOLVE(open);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return traced_open(real_open(path, flags, mode), AT_FDCWD, path, flags);
}

int open64(const char *path, int flags, ...) {
    RESOLVE(open64);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return traced_open(real_open64(path, flags, mode), AT_FDCWD, path, flags);
}

int openat(int dirfd, const char *path, int flags, ...) {
    RESOLVE(openat);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return traced_open(real_openat(dirfd, path, flags, mode), dirfd, path, flags);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    RESOLVE(openat64);
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    return traced_open(real_openat64(dirfd, path, flags, mode), dirfd, path, flags);
}
