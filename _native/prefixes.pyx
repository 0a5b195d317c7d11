# cython: language_level=3
"""Native prefix stripping: same API and results as `denpex._native.prefixes_ref`, which tries a
dozen regexes at the start of a line (about 5 µs a line); this one scans the line's bytes in C,
with no `re` and no object per match.

The scanning is hand-written because the result must equal the twin's on every input: each
pattern is replayed as Python's `re` runs it on bytes (ASCII classes, `re.I` folding ASCII
letters only, `$` also before a final newline). Every bounded repeat here is followed by a byte
its class excludes, so the regex can only match with the repeat taking its whole run, and the
run's length decides: each function says where that needs care (the first label of `_HOST`,
which needs a digit somewhere in it, and glog's optional thread id, which the file name can
stand in for). Times are converted as `datetime` does: the same validation (month, day of the
month with leap years, hour < 24, minute < 60, second 60 read as 59, a `%z` offset of less
than a day with minutes < 60, years 1-9999) and days from the civil date for the UTC seconds.
The bytes are scanned as they are, whatever their encoding, so no line needs the twin: only a
body that is not `bytes` or a year that is neither None nor an `int` goes to it (`fallbacks`
counts them).
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeASCII

from datetime import UTC, datetime

cdef extern from *:
    """
    #include <string.h>

    enum {
        PX_DIGIT = 1, PX_LOWER = 2, PX_UPPER = 4,
        PX_LABEL = 8,       /* [a-z0-9-]: a host name's label */
        PX_POD = 16,        /* [a-z0-9.-]: a kubectl pod */
        PX_WORD = 32,       /* [A-Za-z0-9_.-]: a syslog or NCCL host */
        PX_TAG = 64,        /* [A-Za-z0-9_./-]: a syslog tag */
        PX_NAME = 128,      /* [^ \\]\\n]: glog's and tsl's file name */
        PX_TAIL_HOST = 256  /* [a-z0-9_.-]: the host of an RFC 5424-style syslog line */
    };
    #define PX_ALNUM (PX_DIGIT | PX_LOWER | PX_UPPER)
    static unsigned short px_cls[256];
    #define PX_IS(c, f) (px_cls[(unsigned char)(c)] & (f))

    static void px_init_classes(void) {
        for (int c = 0; c < 256; c++) {
            int digit = c >= '0' && c <= '9', lower = c >= 'a' && c <= 'z';
            int upper = c >= 'A' && c <= 'Z';
            unsigned short f = 0;
            if (digit) f |= PX_DIGIT;
            if (lower) f |= PX_LOWER;
            if (upper) f |= PX_UPPER;
            if (digit || lower || c == '-') f |= PX_LABEL;
            if (digit || lower || c == '-' || c == '.') f |= PX_POD;
            if (digit || lower || c == '-' || c == '.' || c == '_') f |= PX_TAIL_HOST;
            if (digit || lower || upper || c == '-' || c == '.' || c == '_') f |= PX_WORD;
            if (digit || lower || upper || c == '-' || c == '.' || c == '_' || c == '/')
                f |= PX_TAG;
            if (c != ' ' && c != ']' && c != '\\n') f |= PX_NAME;
            px_cls[c] = f;
        }
    }

    typedef const unsigned char px_uc;

    static inline Py_ssize_t px_run(px_uc *b, Py_ssize_t i, Py_ssize_t n, unsigned f) {
        Py_ssize_t j = i;
        while (j < n && PX_IS(b[j], f)) j++;
        return j - i;
    }

    static inline int px_at(px_uc *b, Py_ssize_t i, Py_ssize_t n, unsigned char c) {
        return i < n && b[i] == c;
    }

    static inline int px_lit(px_uc *b, Py_ssize_t i, Py_ssize_t n, const char *lit,
                             Py_ssize_t len) {
        return i + len <= n && memcmp(b + i, lit, (size_t)len) == 0;
    }

    static inline long long px_int(px_uc *b, Py_ssize_t len) {
        long long v = 0;  /* at most 10 digits */
        for (Py_ssize_t i = 0; i < len; i++) v = v * 10 + (b[i] - '0');
        return v;
    }

    /* `\\d\\d` at i */
    static inline int px_dd(px_uc *b, Py_ssize_t i, Py_ssize_t n, int *v) {
        if (i + 2 > n || !PX_IS(b[i], PX_DIGIT) || !PX_IS(b[i + 1], PX_DIGIT)) return 0;
        *v = (b[i] - '0') * 10 + (b[i + 1] - '0');
        return 1;
    }

    /* the month `_MONTHS` names at i, or 0 */
    static int px_month(px_uc *b, Py_ssize_t i, Py_ssize_t n) {
        static const char names[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
        if (i + 3 > n) return 0;
        for (int m = 0; m < 12; m++)
            if (memcmp(b + i, names + 3 * m, 3) == 0) return m + 1;
        return 0;
    }

    /* a stated time: the fields the patterns capture */
    typedef struct {
        int year, month, day, hh, mm, ss;
        Py_ssize_t frac, frac_len;  /* where the fraction's digits are in the body; 0: none */
        int offset_ok;              /* the offset is one `%z` accepts (none, Z: UTC) */
        int offset_s;
    } px_time;

    /* the state of one line as its prefixes are stripped: what the twin's `_Line` holds, the
       objects it was given kept by the caller (None-ness and truth are what is asked of them) */
    typedef struct {
        px_uc *s;
        Py_ssize_t n;
        Py_ssize_t at;          /* the body starts here */
        int year;               /* 1-9999; 0: the current year, not yet known; -1: no year */
        int has_ts, ts_set, ts_valid;
        long long ts_s, ts_frac;
        int host_none, host_true, host_set;
        Py_ssize_t host_at, host_len;
        int rank_none, rank_set;
        long long rank;
        int pid_none, pid_true, pid_set;
        long long pid;
        int is_log;
        int source;             /* 0: as given, else PX_KMSG or PX_SYSLOG */
        Py_ssize_t uptime_at, uptime_len;  /* uptime_len 0: none */
        int log_level;          /* the level's letter, 0: none */
        int cuda_set;
        long long cuda_device;
        int rank_from_message;
    } px_line;

    enum { PX_KMSG = 1, PX_SYSLOG = 2 };
    enum { PX_NEED_YEAR = -1 };  /* a time needs the current year: ask, then scan again */

    static int px_leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

    /* days from 1970-01-01 to a valid proleptic Gregorian date (H. Hinnant's days_from_civil) */
    static long long px_days(int y, int m, int d) {
        y -= m <= 2;
        long long era = (y >= 0 ? y : y - 399) / 400;
        long long yoe = y - era * 400;
        long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
        long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        return era * 146097 + doe - 719468;
    }

    /* the twin's `_utc_ns`: sets the line's time, or None where datetime refuses the fields */
    static void px_set_time(px_line *st, const px_time *t) {
        static const int days_in[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        int ok = t->offset_ok && t->year >= 1 && t->year <= 9999 && t->month >= 1
                 && t->month <= 12 && t->day >= 1 && t->hh <= 23 && t->mm <= 59 && t->ss <= 60;
        if (ok) ok = t->day <= days_in[t->month] + (t->month == 2 && px_leap(t->year));
        st->ts_set = 1;
        st->ts_valid = st->has_ts = ok;
        if (!ok) return;
        int ss = t->ss == 60 ? 59 : t->ss;
        st->ts_s = px_days(t->year, t->month, t->day) * 86400 + t->hh * 3600 + t->mm * 60 + ss
                   - t->offset_s;
        st->ts_frac = 0;
        for (Py_ssize_t i = 0; i < 9; i++)  /* `frac.ljust(9, b"0")` */
            st->ts_frac = st->ts_frac * 10
                          + (i < t->frac_len ? st->s[st->at + t->frac + i] - '0' : 0);
    }

    /* no fraction, UTC: where each pattern's time starts (a pattern that failed may have
       filled them) */
    static inline void px_no_fraction_utc(px_time *t) {
        t->frac_len = 0;
        t->offset_ok = 1;
        t->offset_s = 0;
    }

    /* `(\\d\\d):(\\d\\d):(\\d\\d)` at i */
    static int px_hms(px_uc *b, Py_ssize_t i, Py_ssize_t n, px_time *t) {
        return px_dd(b, i, n, &t->hh) && px_at(b, i + 2, n, ':') && px_dd(b, i + 3, n, &t->mm)
               && px_at(b, i + 5, n, ':') && px_dd(b, i + 6, n, &t->ss);
    }

    /* `([A-Z][a-z]{2}) {1,2}(\\d{1,2}) (\\d\\d):(\\d\\d):(\\d\\d)` at i (month 0 where no
       month is named): the end, or -1 */
    static Py_ssize_t px_month_day_time(px_uc *b, Py_ssize_t i, Py_ssize_t n, px_time *t) {
        px_no_fraction_utc(t);
        if (i + 3 > n || !PX_IS(b[i], PX_UPPER) || !PX_IS(b[i + 1], PX_LOWER)
            || !PX_IS(b[i + 2], PX_LOWER))
            return -1;
        t->month = px_month(b, i, n);
        Py_ssize_t p = i + 3, spaces = 0, digits;
        while (px_at(b, p + spaces, n, ' ')) spaces++;
        if (spaces < 1 || spaces > 2) return -1;
        p += spaces;
        digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 2 || !px_at(b, p + digits, n, ' ')) return -1;
        t->day = (int)px_int(b + p, digits);
        p += digits + 1;
        return px_hms(b, p, n, t) ? p + 8 : -1;
    }

    /* `(\\d{4})-(\\d\\d)-(\\d\\d)<sep>(\\d\\d):(\\d\\d):(\\d\\d)` at i, sep ' ' or also 'T' */
    static int px_date_time(px_uc *b, Py_ssize_t i, Py_ssize_t n, int t_sep, px_time *t) {
        int hi, lo;
        px_no_fraction_utc(t);
        if (!(px_dd(b, i, n, &hi) && px_dd(b, i + 2, n, &lo) && px_at(b, i + 4, n, '-')
              && px_dd(b, i + 5, n, &t->month) && px_at(b, i + 7, n, '-')
              && px_dd(b, i + 8, n, &t->day) && i + 10 < n
              && (b[i + 10] == ' ' || (t_sep && b[i + 10] == 'T'))))
            return 0;
        t->year = hi * 100 + lo;
        return px_hms(b, i + 11, n, t);
    }

    /* `\\.(\\d{1,9})` at i, then a byte that is no digit: the end, or -1 */
    static Py_ssize_t px_fraction(px_uc *b, Py_ssize_t i, Py_ssize_t n, px_time *t) {
        Py_ssize_t digits = px_run(b, i + 1, n, PX_DIGIT);
        if (digits < 1 || digits > 9) return -1;
        t->frac = i + 1;
        t->frac_len = digits;
        return i + 1 + digits;
    }

    /* `_DMESG`: `\\[ {0,12}(\\d{1,10}\\.\\d{1,9})\\] ?`; the uptime's text at *num */
    static Py_ssize_t px_dmesg(px_uc *b, Py_ssize_t n, Py_ssize_t *num, Py_ssize_t *len) {
        Py_ssize_t i = 1, spaces = 0, digits;
        if (!px_at(b, 0, n, '[')) return -1;
        while (px_at(b, i + spaces, n, ' ')) spaces++;
        if (spaces > 12) return -1;
        i += spaces;
        *num = i;
        digits = px_run(b, i, n, PX_DIGIT);
        if (digits < 1 || digits > 10 || !px_at(b, i + digits, n, '.')) return -1;
        i += digits + 1;
        digits = px_run(b, i, n, PX_DIGIT);
        if (digits < 1 || digits > 9 || !px_at(b, i + digits, n, ']')) return -1;
        i += digits;
        *len = i - *num;
        i++;
        return px_at(b, i, n, ' ') ? i + 1 : i;
    }

    /* `_DMESG_T`'s part after the optional weekday, at i */
    static Py_ssize_t px_dmesg_t_at(px_uc *b, Py_ssize_t i, Py_ssize_t n, px_time *t) {
        int hi, lo;
        Py_ssize_t p = px_month_day_time(b, i, n, t);
        if (p < 0 || !px_at(b, p, n, ' ') || !px_dd(b, p + 1, n, &hi)
            || !px_dd(b, p + 3, n, &lo) || !px_at(b, p + 5, n, ']'))
            return -1;
        t->year = hi * 100 + lo;
        p += 6;
        return px_at(b, p, n, ' ') ? p + 1 : p;
    }

    /* `_DMESG_T`: `\\[(?:[A-Z][a-z]{2} )?` then the month: the weekday is tried first, and
       where the rest fails after it, the rest right after the bracket */
    static Py_ssize_t px_dmesg_t(px_uc *b, Py_ssize_t n, px_time *t) {
        Py_ssize_t end;
        if (!px_at(b, 0, n, '[')) return -1;
        if (n > 4 && PX_IS(b[1], PX_UPPER) && PX_IS(b[2], PX_LOWER) && PX_IS(b[3], PX_LOWER)
            && b[4] == ' ') {
            end = px_dmesg_t_at(b, 5, n, t);
            if (end >= 0) return end;
        }
        return px_dmesg_t_at(b, 1, n, t);
    }

    /* `([A-Za-z0-9_./-]{1,48})(?:\\[(\\d{1,10})\\])?: ?` at p: a syslog tag and its pid */
    static Py_ssize_t px_tag(px_uc *b, Py_ssize_t p, Py_ssize_t n, Py_ssize_t *tag,
                             Py_ssize_t *tag_len, Py_ssize_t *pid, Py_ssize_t *pid_len) {
        Py_ssize_t len = px_run(b, p, n, PX_TAG), digits;
        if (len < 1 || len > 48) return -1;
        *tag = p;
        *tag_len = len;
        *pid_len = 0;
        p += len;
        if (px_at(b, p, n, '[')) {  /* else `:` must stand where the `[` is */
            digits = px_run(b, p + 1, n, PX_DIGIT);
            if (digits < 1 || digits > 10 || !px_at(b, p + 1 + digits, n, ']')) return -1;
            *pid = p + 1;
            *pid_len = digits;
            p += digits + 2;
        }
        if (!px_at(b, p, n, ':')) return -1;
        p++;
        return px_at(b, p, n, ' ') ? p + 1 : p;
    }

    static int px_is_tag(px_uc *b, Py_ssize_t tag, Py_ssize_t len, const char *name) {
        return len == (Py_ssize_t)strlen(name) && memcmp(b + tag, name, (size_t)len) == 0;
    }

    /* `_SYSLOG`: month, day, time, `([A-Za-z0-9][A-Za-z0-9_.-]{0,62}) ` and the tag */
    static Py_ssize_t px_syslog(px_uc *b, Py_ssize_t n, px_time *t, Py_ssize_t *host,
                                Py_ssize_t *host_len, Py_ssize_t *tag, Py_ssize_t *tag_len,
                                Py_ssize_t *pid, Py_ssize_t *pid_len) {
        Py_ssize_t p = px_month_day_time(b, 0, n, t), len;
        if (p < 0 || !px_at(b, p, n, ' ')) return -1;
        p++;
        if (p >= n || !PX_IS(b[p], PX_ALNUM)) return -1;
        len = px_run(b, p, n, PX_WORD);
        if (len > 63 || !px_at(b, p + len, n, ' ')) return -1;
        *host = p;
        *host_len = len;
        return px_tag(b, p + len + 1, n, tag, tag_len, pid, pid_len);
    }

    /* `_ISO`: `\\[?` date `[T ]` time, fraction `[.,]`, offset `Z|[+-]\\d\\d:?\\d\\d`, `\\]?`,
       then a space or the end (`$`: also before a final newline). Each optional part starts
       with a byte nothing after it may start with, so where one is there it must match */
    static Py_ssize_t px_iso(px_uc *b, Py_ssize_t n, px_time *t) {
        Py_ssize_t i = px_at(b, 0, n, '[') ? 1 : 0, p = i + 19, q;
        int oh, om;
        if (!px_date_time(b, i, n, 1, t)) return -1;
        if (px_at(b, p, n, '.') || px_at(b, p, n, ',')) {
            p = px_fraction(b, p, n, t);
            if (p < 0) return -1;
        }
        if (px_at(b, p, n, 'Z')) {
            p++;
        } else if (px_at(b, p, n, '+') || px_at(b, p, n, '-')) {
            q = p + 3;
            if (px_at(b, q, n, ':')) q++;
            if (!px_dd(b, p + 1, n, &oh) || !px_dd(b, q, n, &om)) return -1;
            /* what `datetime.strptime(text, "%z")` accepts: minutes < 60, then less than a
               day either way (timezone() refuses +24:00) */
            t->offset_ok = om <= 59 && oh <= 23;
            t->offset_s = (b[p] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
            p = q + 2;
        }
        if (px_at(b, p, n, ']')) p++;
        if (px_at(b, p, n, ' ')) return p + 1;
        return (p == n || (p == n - 1 && b[p] == '\\n')) ? p : -1;
    }

    /* `_TSL_LOG`: `\\[?` date ` ` time `\\.(\\d{1,9}): ([TDIWEF]) [^ \\]\\n]{1,300}\\] ?` */
    static Py_ssize_t px_tsl(px_uc *b, Py_ssize_t n, px_time *t, int *level) {
        Py_ssize_t i = px_at(b, 0, n, '[') ? 1 : 0, p, len;
        if (!px_date_time(b, i, n, 0, t) || !px_at(b, i + 19, n, '.')) return -1;
        p = px_fraction(b, i + 19, n, t);
        if (p < 0 || !px_at(b, p, n, ':') || !px_at(b, p + 1, n, ' ') || p + 3 >= n
            || !strchr("TDIWEF", b[p + 2]) || b[p + 2] == 0 || b[p + 3] != ' ')
            return -1;
        *level = b[p + 2];
        p += 4;
        len = px_run(b, p, n, PX_NAME);
        if (len < 1 || len > 300 || !px_at(b, p + len, n, ']')) return -1;
        p += len + 1;
        return px_at(b, p, n, ' ') ? p + 1 : p;
    }

    /* ` [^ \\]\\n]{1,200}\\]` at p, glog's file name */
    static Py_ssize_t px_glog_name(px_uc *b, Py_ssize_t p, Py_ssize_t n) {
        Py_ssize_t len;
        if (!px_at(b, p, n, ' ')) return -1;
        len = px_run(b, p + 1, n, PX_NAME);
        return (len >= 1 && len <= 200 && px_at(b, p + 1 + len, n, ']')) ? p + 2 + len : -1;
    }

    /* `_GLOG`: `\\[?([IWEF])(\\d{3,4}) ` time `\\.(\\d{1,9})(?: {1,8}\\d{1,10})?` then the
       name. The thread id is tried first; where the rest fails after it, the name is tried
       right after the fraction (a file name of digits, `123]`, stands where an id would) */
    static Py_ssize_t px_glog(px_uc *b, Py_ssize_t n, px_time *t, int *level) {
        Py_ssize_t i = px_at(b, 0, n, '[') ? 1 : 0, p, spaces, digits, end;
        px_no_fraction_utc(t);
        if (i >= n || !strchr("IWEF", b[i]) || b[i] == 0) return -1;
        *level = b[i];
        digits = px_run(b, i + 1, n, PX_DIGIT);
        if (digits < 3 || digits > 4 || !px_at(b, i + 1 + digits, n, ' ')) return -1;
        long long monthday = px_int(b + i + 1, digits);
        t->month = (int)(monthday / 100);
        t->day = (int)(monthday % 100);
        p = i + 2 + digits;
        if (!px_hms(b, p, n, t) || !px_at(b, p + 8, n, '.')) return -1;
        p = px_fraction(b, p + 8, n, t);
        if (p < 0) return -1;
        spaces = 0;
        while (px_at(b, p + spaces, n, ' ')) spaces++;
        if (spaces >= 1 && spaces <= 8) {
            digits = px_run(b, p + spaces, n, PX_DIGIT);
            if (digits >= 1 && digits <= 10) {
                end = px_glog_name(b, p + spaces + digits, n);
                if (end >= 0) return px_at(b, end, n, ' ') ? end + 1 : end;
            }
        }
        end = px_glog_name(b, p, n);
        if (end < 0) return -1;
        return px_at(b, end, n, ' ') ? end + 1 : end;
    }

    /* `_TORCHRUN`: `\\[(rank|default|trainer|worker)(\\d{1,6})\\]: ?`; *global_rank: `rank` */
    static Py_ssize_t px_torchrun(px_uc *b, Py_ssize_t n, long long *rank, int *global_rank) {
        static const char *const roles[4] = {"rank", "default", "trainer", "worker"};
        Py_ssize_t p = -1, digits;
        if (!px_at(b, 0, n, '[')) return -1;
        for (int r = 0; r < 4; r++) {
            Py_ssize_t len = (Py_ssize_t)strlen(roles[r]);
            if (px_lit(b, 1, n, roles[r], len)) {
                p = 1 + len;
                *global_rank = r == 0;
                break;
            }
        }
        if (p < 0) return -1;
        digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 6 || !px_lit(b, p + digits, n, "]:", 2)) return -1;
        *rank = px_int(b + p, digits);
        p += digits + 2;
        return px_at(b, p, n, ' ') ? p + 1 : p;
    }

    /* `_SRUN`: `(\\d{1,6}): ` */
    static Py_ssize_t px_srun(px_uc *b, Py_ssize_t n, long long *rank) {
        Py_ssize_t digits = px_run(b, 0, n, PX_DIGIT);
        if (digits < 1 || digits > 6 || !px_lit(b, digits, n, ": ", 2)) return -1;
        *rank = px_int(b, digits);
        return digits + 2;
    }

    /* `\\[(\\d{1,6})\\]<(?:stdout|stderr[|stddiag])>: ?` at p, the rank's part of mpirun's and
       horovod's tags */
    static Py_ssize_t px_stream_tag(px_uc *b, Py_ssize_t p, Py_ssize_t n, int stddiag,
                                    long long *rank) {
        Py_ssize_t digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 6 || !px_lit(b, p + digits, n, "]<", 2)) return -1;
        *rank = px_int(b + p, digits);
        p += digits + 2;
        if (!(px_lit(b, p, n, "stdout>:", 8) || px_lit(b, p, n, "stderr>:", 8)
              || (stddiag && px_lit(b, p, n, "stddiag>:", 9))))
            return -1;
        p += b[p + 6] == '>' ? 8 : 9;
        return px_at(b, p, n, ' ') ? p + 1 : p;
    }

    /* `_MPIRUN`: `\\[\\d{1,6},(\\d{1,6})\\]<(?:stdout|stderr|stddiag)>: ?` */
    static Py_ssize_t px_mpirun(px_uc *b, Py_ssize_t n, long long *rank) {
        Py_ssize_t digits;
        if (!px_at(b, 0, n, '[')) return -1;
        digits = px_run(b, 1, n, PX_DIGIT);
        if (digits < 1 || digits > 6 || !px_at(b, 1 + digits, n, ',')) return -1;
        return px_stream_tag(b, digits + 2, n, 1, rank);
    }

    /* `_HOROVOD_RANK`: an optional `time.asctime()` (weekday, month, day, time, year), then
       `\\[(\\d{1,6})\\]<(?:stdout|stderr)>: ?`; t->month 0: no time */
    static Py_ssize_t px_horovod(px_uc *b, Py_ssize_t n, px_time *t, long long *rank) {
        Py_ssize_t p;
        int hi, lo;
        t->month = 0;
        if (px_at(b, 0, n, '[')) return px_stream_tag(b, 1, n, 0, rank);
        if (n < 4 || !PX_IS(b[0], PX_UPPER) || !PX_IS(b[1], PX_LOWER)
            || !PX_IS(b[2], PX_LOWER) || b[3] != ' ')
            return -1;
        p = px_month_day_time(b, 4, n, t);
        if (p < 0 || !px_at(b, p, n, ' ') || !px_dd(b, p + 1, n, &hi)
            || !px_dd(b, p + 3, n, &lo) || !px_at(b, p + 5, n, '['))
            return -1;
        t->year = hi * 100 + lo;
        return px_stream_tag(b, p + 6, n, 0, rank);
    }

    /* `_KUBECTL`: `\\[?pod/([a-z0-9][a-z0-9.-]{0,252})(?:/[a-z0-9-]{1,63})?\\]? ` */
    static Py_ssize_t px_kubectl(px_uc *b, Py_ssize_t n, Py_ssize_t *host, Py_ssize_t *len) {
        Py_ssize_t p = px_at(b, 0, n, '[') ? 1 : 0, container;
        if (!px_lit(b, p, n, "pod/", 4)) return -1;
        p += 4;
        if (p >= n || !PX_IS(b[p], PX_LOWER | PX_DIGIT)) return -1;
        *host = p;
        *len = px_run(b, p, n, PX_POD);
        if (*len > 253) return -1;
        p += *len;
        if (px_at(b, p, n, '/')) {  /* else `]` or ` ` must stand where the `/` is */
            container = px_run(b, p + 1, n, PX_LABEL);
            if (container < 1 || container > 63) return -1;
            p += 1 + container;
        }
        if (px_at(b, p, n, ']')) p++;
        return px_at(b, p, n, ' ') ? p + 1 : -1;
    }

    /* `(?:\\.[a-z0-9-]{1,63}){0,6}: ` at p, a host name's domain: where its `: ` is, or -1 */
    static Py_ssize_t px_domain(px_uc *b, Py_ssize_t p, Py_ssize_t n) {
        for (int labels = 0; px_at(b, p, n, '.'); labels++) {
            Py_ssize_t len = px_run(b, p + 1, n, PX_LABEL);
            if (labels == 6 || len < 1 || len > 63) return -1;
            p += 1 + len;
        }
        return px_lit(b, p, n, ": ", 2) ? p : -1;
    }

    /* `_HOST`: `([a-z][a-z0-9-]{0,40}[0-9][a-z0-9-]{0,20}` + domain + `): `, the host's
       length. The first label is all of the run of [a-z0-9-] (a `.` or `:` must follow it);
       the regex can split it around a digit at index k when 1 <= k <= 41 and at most 20
       bytes follow the digit */
    static Py_ssize_t px_host(px_uc *b, Py_ssize_t n) {
        Py_ssize_t label, lo, hi, k;
        if (n < 1 || !PX_IS(b[0], PX_LOWER)) return -1;
        label = 1 + px_run(b, 1, n, PX_LABEL);
        lo = label - 21 > 1 ? label - 21 : 1;
        hi = label - 1 < 41 ? label - 1 : 41;
        for (k = lo; k <= hi; k++)
            if (PX_IS(b[k], PX_DIGIT)) return px_domain(b, label, n);
        return -1;
    }

    /* `_HOST_BEFORE_PREFIX`'s lookahead at q: another prefix follows the host */
    static int px_prefix_follows(px_uc *b, Py_ssize_t q, Py_ssize_t n) {
        Py_ssize_t len, digits;
        int v;
        if (px_at(b, q, n, '[')) {  /* `\\[(?:rank|default)\\d` */
            if (px_lit(b, q + 1, n, "rank", 4) && q + 5 < n && PX_IS(b[q + 5], PX_DIGIT))
                return 1;
            if (px_lit(b, q + 1, n, "default", 7) && q + 8 < n && PX_IS(b[q + 8], PX_DIGIT))
                return 1;
        }
        digits = px_run(b, q, n, PX_DIGIT);  /* `\\d{1,6}: ` */
        if (digits >= 1 && digits <= 6 && px_lit(b, q + digits, n, ": ", 2)) return 1;
        if (px_dd(b, q, n, &v) && px_dd(b, q + 2, n, &v) && px_at(b, q + 4, n, '-')
            && px_dd(b, q + 5, n, &v) && px_at(b, q + 7, n, '-') && px_dd(b, q + 8, n, &v))
            return 1;  /* `\\d{4}-\\d\\d-\\d\\d` */
        /* `[A-Za-z0-9_.-]{1,63}:\\d{1,10}:\\d{1,10} \\[` */
        len = px_run(b, q, n, PX_WORD);
        if (len < 1 || len > 63 || !px_at(b, q + len, n, ':')) return 0;
        q += len + 1;
        digits = px_run(b, q, n, PX_DIGIT);
        if (digits < 1 || digits > 10 || !px_at(b, q + digits, n, ':')) return 0;
        q += digits + 1;
        digits = px_run(b, q, n, PX_DIGIT);
        return digits >= 1 && digits <= 10 && px_lit(b, q + digits, n, " [", 2);
    }

    /* `_HOST_BEFORE_PREFIX`: `([a-z][a-z0-9-]{0,62}` + domain + `): ` and the lookahead */
    static Py_ssize_t px_host_before_prefix(px_uc *b, Py_ssize_t n) {
        Py_ssize_t label, end;
        if (n < 1 || !PX_IS(b[0], PX_LOWER)) return -1;
        label = 1 + px_run(b, 1, n, PX_LABEL);
        if (label > 63) return -1;
        end = px_domain(b, label, n);
        return (end >= 0 && px_prefix_follows(b, end + 2, n)) ? end : -1;
    }

    /* `NOT_HOSTS`: a word that names no host, `[_-]?\\d` after it, letters in any case */
    static int px_not_host(px_uc *b, Py_ssize_t n) {
        static const char *const words[] = {
            "rank", "default", "step", "epoch", "iter", "iteration", "gpu", "cuda", "device",
            "worker", "layer", "batch", "node_rank", "local_rank", "task", "proc", "cpu",
            "shard", "run", "job", "exp", "trial", "test", "attempt", "try", "log", "logs",
            "out", "output", "v", "version", "ckpt", "checkpoint", "model", NULL};
        for (int w = 0; words[w]; w++) {
            Py_ssize_t len = (Py_ssize_t)strlen(words[w]), i;
            if (len >= n) continue;
            for (i = 0; i < len; i++) {
                unsigned char c = b[i];
                if ((PX_IS(c, PX_UPPER) ? c + 32 : c) != (unsigned char)words[w][i]) break;
            }
            if (i < len) continue;
            if (b[i] == '_' || b[i] == '-') i++;
            if (i < n && PX_IS(b[i], PX_DIGIT)) return 1;
        }
        return 0;
    }

    /* `_NCCL_HOST`: `([A-Za-z0-9][A-Za-z0-9_.-]{0,62}):(\\d{1,10}):(\\d{1,10}) \\[(\\d{1,3})\\] ` */
    static Py_ssize_t px_nccl(px_uc *b, Py_ssize_t n, Py_ssize_t *host_len, long long *pid,
                              long long *device) {
        Py_ssize_t len, digits, p;
        if (n < 1 || !PX_IS(b[0], PX_ALNUM)) return -1;
        len = px_run(b, 0, n, PX_WORD);
        if (len > 63 || !px_at(b, len, n, ':')) return -1;
        *host_len = len;
        p = len + 1;
        digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 10 || !px_at(b, p + digits, n, ':')) return -1;
        *pid = px_int(b + p, digits);
        p += digits + 1;
        digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 10 || !px_lit(b, p + digits, n, " [", 2)) return -1;
        p += digits + 2;
        digits = px_run(b, p, n, PX_DIGIT);
        if (digits < 1 || digits > 3 || !px_lit(b, p + digits, n, "] ", 2)) return -1;
        *device = px_int(b + p, digits);
        return p + digits + 2;
    }

    /* `_RANK_IN_BODY`, searched: the leftmost `\\[Rank (\\d{1,6})\\]` */
    static int px_rank_in_body(px_uc *b, Py_ssize_t n, long long *rank) {
        Py_ssize_t from = 0, digits;
        while (from + 8 <= n) {
            px_uc *hit = memchr(b + from, '[', (size_t)(n - from));
            if (!hit) return 0;
            Py_ssize_t at = hit - b;
            if (px_lit(b, at + 1, n, "Rank ", 5)) {
                digits = px_run(b, at + 6, n, PX_DIGIT);
                if (digits >= 1 && digits <= 6 && px_at(b, at + 6 + digits, n, ']')) {
                    *rank = px_int(b + at + 6, digits);
                    return 1;
                }
            }
            from = at + 1;
        }
        return 0;
    }

    static void px_set_host(px_line *st, Py_ssize_t at, Py_ssize_t len) {
        st->host_set = 1;
        st->host_at = at;
        st->host_len = len;
        st->host_none = 0;
        st->host_true = 1;  /* every pattern's host has a byte */
    }

    static void px_set_pid(px_line *st, long long pid) {
        st->pid_set = 1;
        st->pid = pid;
        st->pid_none = 0;
        st->pid_true = pid != 0;
    }

    static void px_set_rank(px_line *st, long long rank) {
        st->rank_set = 1;
        st->rank = rank;
        st->rank_none = 0;
    }

    /* the twin's `_strip_host` on the body b (at st->at) */
    static int px_strip_host(px_line *st, px_uc *b, Py_ssize_t n) {
        Py_ssize_t host, len, end = px_kubectl(b, n, &host, &len);
        if (end >= 0) {
            px_set_host(st, st->at + host, len);
            st->at += end;
            return 1;
        }
        len = px_host(b, n);
        if (len < 0) len = px_host_before_prefix(b, n);
        if (len >= 0 && !px_not_host(b, n)) {
            px_set_host(st, st->at, len);
            st->at += len + 2;
            return 1;
        }
        return 0;
    }

    /* the twin's `_strip_leading`: 1 when a prefix was stripped, 0 when none applies, or
       PX_NEED_YEAR */
    static int px_strip_leading(px_line *st) {
        px_uc *b = st->s + st->at;
        Py_ssize_t n = st->n - st->at, end, num, len, host, host_len, tag, tag_len, pid, pid_len;
        px_time t;
        long long rank;
        int level, global_rank;
        if (n == 0) return 0;
        /* every prefix starts with `[`, a digit or a letter, and only a host name (or
           kubectl's `pod/`) with a small letter */
        if (PX_IS(b[0], PX_LOWER)) return st->host_none && px_strip_host(st, b, n);
        if (!(b[0] == '[' || PX_IS(b[0], PX_ALNUM))) return 0;
        if (!st->has_ts && st->is_log) {
            end = px_dmesg(b, n, &num, &len);
            if (end >= 0) {
                st->source = PX_KMSG;
                st->is_log = 0;
                st->uptime_at = st->at + num;
                st->uptime_len = len;
                st->at += end;
                return 1;
            }
            end = px_dmesg_t(b, n, &t);
            if (end >= 0 && t.month) {
                px_set_time(st, &t);
                st->source = PX_KMSG;
                st->is_log = 0;
                st->at += end;
                return 1;
            }
            end = px_syslog(b, n, &t, &host, &host_len, &tag, &tag_len, &pid, &pid_len);
            if (end >= 0 && t.month) {
                if (st->year == 0) return PX_NEED_YEAR;
                t.year = st->year;
                px_set_time(st, &t);
                px_set_host(st, st->at + host, host_len);
                st->source = px_is_tag(b, tag, tag_len, "kernel") ? PX_KMSG : PX_SYSLOG;
                st->is_log = 0;
                if (pid_len) px_set_pid(st, px_int(b + pid, pid_len));
                st->at += end;
                if (st->source == PX_KMSG) {  /* a kernel line keeps its own [uptime] prefix */
                    end = px_dmesg(st->s + st->at, st->n - st->at, &num, &len);
                    if (end >= 0) {
                        st->uptime_at = st->at + num;
                        st->uptime_len = len;
                        st->at += end;
                    }
                }
                return 1;
            }
        }
        if (!st->has_ts) {
            end = px_tsl(b, n, &t, &level);
            if (end >= 0) {  /* an impossible date leaves the line untimed, still stripped */
                px_set_time(st, &t);
                st->at += end;
                st->log_level = level;
                return 1;
            }
            end = px_iso(b, n, &t);
            if (end >= 0) {
                px_set_time(st, &t);
                st->at += end;
                b = st->s + st->at;
                n = st->n - st->at;
                if (px_lit(b, 0, n, "- ", 2)) {  /* Python logging's "%(asctime)s - …" */
                    st->at += 2;
                    b += 2;
                    n -= 2;
                }
                /* RFC 5424-style syslog: "<time> <host> <tag>[pid]: message", the tag a
                   daemon we know or with a pid */
                if (!st->is_log || !st->host_none || n < 1
                    || !PX_IS(b[0], PX_LOWER | PX_DIGIT))
                    return 1;
                host_len = px_run(b, 0, n, PX_TAIL_HOST);
                if (host_len > 63 || !px_at(b, host_len, n, ' ')) return 1;
                end = px_tag(b, host_len + 1, n, &tag, &tag_len, &pid, &pid_len);
                if (end < 0) return 1;
                int kernel = px_is_tag(b, tag, tag_len, "kernel");
                if (!(kernel || px_is_tag(b, tag, tag_len, "slurmd")
                      || px_is_tag(b, tag, tag_len, "slurmstepd") || pid_len))
                    return 1;
                px_set_host(st, st->at, host_len);
                st->source = kernel ? PX_KMSG : PX_SYSLOG;
                st->is_log = 0;
                if (pid_len) px_set_pid(st, px_int(b + pid, pid_len));
                st->at += end;
                return 1;
            }
        }
        end = px_glog(b, n, &t, &level);
        if (end >= 0) {
            if (!st->has_ts) {
                if (st->year == 0) return PX_NEED_YEAR;
                t.year = st->year;
                px_set_time(st, &t);
            }
            st->at += end;
            st->log_level = level;
            return 1;
        }
        end = px_torchrun(b, n, &rank, &global_rank);
        /* `[rank11]:` names the global rank, so it replaces a local `[default3]:` or srun id */
        if (end >= 0 && (st->rank_none || global_rank)) {
            px_set_rank(st, rank);
            st->at += end;
            return 1;
        }
        if (st->rank_none) {
            end = px_srun(b, n, &rank);
            if (end < 0) end = px_mpirun(b, n, &rank);
            if (end >= 0) {
                px_set_rank(st, rank);
                st->at += end;
                return 1;
            }
            end = px_horovod(b, n, &t, &rank);
            if (end >= 0) {
                if (t.month && !st->has_ts) px_set_time(st, &t);
                px_set_rank(st, rank);
                st->at += end;
                return 1;
            }
        }
        return st->host_none && px_strip_host(st, b, n);
    }

    /* the twin's strip_prefixes on st (its state set by the caller): 0, or PX_NEED_YEAR */
    static int px_strip(px_line *st) {
        px_uc *b;
        Py_ssize_t n, host_len;
        long long pid, device, rank;
        for (int k = 0; k < 6; k++) {
            int stripped = px_strip_leading(st);
            if (stripped < 0) return stripped;
            if (!stripped) break;
        }
        b = st->s + st->at;
        n = st->n - st->at;
        if ((st->host_none || st->pid_none) && px_nccl(b, n, &host_len, &pid, &device) >= 0) {
            if (!st->host_true) px_set_host(st, st->at, host_len);
            if (!st->pid_true) px_set_pid(st, pid);
            st->cuda_set = 1;
            st->cuda_device = device;
        }
        if (st->rank_none && px_rank_in_body(b, n, &rank)) {
            px_set_rank(st, rank);
            st->rank_from_message = 1;
        }
        return 0;
    }
    """
    ctypedef const unsigned char px_uc

    ctypedef struct px_line:
        px_uc* s
        Py_ssize_t n
        Py_ssize_t at
        int year
        int has_ts
        int ts_set
        int ts_valid
        long long ts_s
        long long ts_frac
        int host_none
        int host_true
        int host_set
        Py_ssize_t host_at
        Py_ssize_t host_len
        int rank_none
        int rank_set
        long long rank
        int pid_none
        int pid_true
        int pid_set
        long long pid
        int is_log
        int source
        Py_ssize_t uptime_at
        Py_ssize_t uptime_len
        int log_level
        int cuda_set
        long long cuda_device
        int rank_from_message

    enum:
        PX_KMSG
        PX_SYSLOG
        PX_NEED_YEAR

    void px_init_classes()
    int px_strip(px_line* st)

px_init_classes()

fallbacks = 0  # calls handed to the twin (a body not `bytes`, a year neither None nor an int)

# seconds whose ns fit a long long (about 1685-2255); others are multiplied as Python ints
cdef long long _NS_SAFE_SECONDS = 9_000_000_000


cdef int _c_year(object year):
    """The year as px_line holds it: 0 for None and 0 (the current year), -1 outside 1-9999."""
    if year is None or year == 0:
        return 0
    return year if 1 <= year <= 9999 else -1


cdef void _start(px_line* st, bytes body, int year, object ts_ns, object host, object rank,
                 object pid, object source):
    st.s = <px_uc*>PyBytes_AS_STRING(body)
    st.n = PyBytes_GET_SIZE(body)
    st.at = 0
    st.year = year
    st.has_ts = ts_ns is not None
    st.ts_set = st.ts_valid = 0
    st.host_none = host is None
    st.host_true = bool(host)
    st.host_set = 0
    st.rank_none = rank is None
    st.rank_set = 0
    st.pid_none = pid is None
    st.pid_true = bool(pid)
    st.pid_set = 0
    st.is_log = source == "log"
    st.source = 0
    st.uptime_len = 0
    st.log_level = 0
    st.cuda_set = 0
    st.rank_from_message = 0


def strip_prefixes(body, year, ts_ns, host, rank, pid, source):
    """See `denpex._native.prefixes_ref.strip_prefixes`: the same fields from the same line."""
    global fallbacks
    cdef px_line st
    if type(body) is not bytes or not (year is None or type(year) is int):
        from denpex._native.prefixes_ref import strip_prefixes as reference

        fallbacks += 1
        return reference(body, year, ts_ns, host, rank, pid, source)
    _start(&st, body, _c_year(year), ts_ns, host, rank, pid, source)
    if px_strip(&st) == PX_NEED_YEAR:  # a syslog or glog time without a year given
        _start(&st, body, _c_year(datetime.now(UTC).year), ts_ns, host, rank, pid, source)
        px_strip(&st)
    if st.ts_set:
        if not st.ts_valid:
            ts_ns = None
        elif -_NS_SAFE_SECONDS < st.ts_s < _NS_SAFE_SECONDS:
            ts_ns = PyLong_FromLongLong(st.ts_s * 1_000_000_000 + st.ts_frac)
        else:
            ts_ns = PyLong_FromLongLong(st.ts_s) * 1_000_000_000 + st.ts_frac
    if st.host_set:
        host = PyUnicode_DecodeASCII(<char*>st.s + st.host_at, st.host_len, NULL)
    if st.source == PX_KMSG:
        source = "kmsg"
    elif st.source == PX_SYSLOG:
        source = "syslog"
    return (
        st.at,
        ts_ns,
        host,
        PyLong_FromLongLong(st.rank) if st.rank_set else rank,
        PyLong_FromLongLong(st.pid) if st.pid_set else pid,
        source,
        float(body[st.uptime_at : st.uptime_at + st.uptime_len]) if st.uptime_len else None,
        chr(st.log_level) if st.log_level else None,
        PyLong_FromLongLong(st.cuda_device) if st.cuda_set else None,
        bool(st.rank_from_message),
    )
