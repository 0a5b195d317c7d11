# cython: language_level=3
"""Native step-numbers parser: same API and results as `denpex._native.stepnumbers_ref`, which
reads a line with a dozen regexes (about 30 µs a line); this one scans the line's bytes in C once
per pattern, with no `re` and no object per match.

The scanning is hand-written because no library does this exact parse: the result must equal the
twin's on every input, so each pattern is replayed as Python's `re` runs it (leftmost
non-overlapping matches, greedy repeats and what backtracking into them can reach, the
possessive repeats, lookarounds, `$` before a final newline), a number is what `float()` gives
for the matched text (correctly rounded: an exact fast path, else CPython's own
PyOS_string_to_double), and character positions are those of the line's decoded text. It handles
in C every line whose decoded text holds only ASCII and characters that are neither alphanumeric
(`\\w`, `\\d`) nor whitespace (`str.split`, `strip`), such as tqdm's blocks and U+FFFD from
invalid UTF-8: to every pattern those behave alike, bar `━` (U+2501, in `_BAR_PROGRESS`) and `µ`
(U+00B5, a word character, in the `µs` unit), which get a byte of their own. Any other line
(Unicode letters, digits, spaces), and anything not `bytes`, goes to the twin; `fallbacks`
counts them.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_FromDouble, PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_GET_LENGTH
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    #include <float.h>
    #include <math.h>
    #include <string.h>

    /* The text is scanned one byte a character: ASCII as it is, the non-ASCII characters the
       fast path allows as one of these (never equal to a pattern's ASCII byte) */
    #define SN_OTHER 0x80
    #define SN_BOX 0x81    /* U+2501: `_BAR_PROGRESS` ends on `[` or it */
    #define SN_MICRO 0x82  /* U+00B5: `\\w`, and the `µs` unit */

    #define SN_MAXKEY 64     /* no pattern takes a key longer */
    #define SN_MAXSLOTS 128  /* distinct keys of the tables */
    #define SN_MAXENTRIES 512

    enum { SN_WORD = 1, SN_DIGIT = 2, SN_ALPHA = 4, SN_SPACE = 8, SN_KEYC = 16, SN_SEGC = 32 };
    static unsigned char sn_cls[256];
    #define SN_IS(c, f) (sn_cls[(unsigned char)(c)] & (f))

    static void sn_init_classes(void) {
        for (int c = 0; c < 256; c++) {
            int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
            int digit = c >= '0' && c <= '9';
            unsigned char f = 0;
            if (alpha) f |= SN_ALPHA;
            if (digit) f |= SN_DIGIT;
            if (alpha || digit || c == '_' || c == SN_MICRO) f |= SN_WORD;
            /* str.isspace() of ASCII: \\t\\n\\v\\f\\r, the separators 0x1c-0x1f, space */
            if ((c >= 9 && c <= 13) || (c >= 28 && c <= 32)) f |= SN_SPACE;
            if ((f & SN_WORD) || c == '/' || c == '.' || c == '-') f |= SN_KEYC;
            if ((f & SN_WORD) || c == ' ' || c == '/' || c == '.' || c == '(' || c == ')'
                || c == '-') f |= SN_SEGC;
            sn_cls[c] = f;
        }
    }

    /* the parser's tables: keys by length (slot = index), and each role's slots in table order */
    enum { R_LOSS, R_GRAD, R_SCALE, R_LR, R_STEP, R_STEPTIME, R_THROUGHPUT, R_SUMMARY, R_EPOCH,
           R_TIME, R_NSKIPPED, R_SKIPPED, R_COUNT };
    typedef struct {
        int nslots;
        unsigned char key[SN_MAXSLOTS][SN_MAXKEY];
        int by_len[SN_MAXKEY + 2];  /* slots of length L: [by_len[L], by_len[L + 1]) */
        int role_start[R_COUNT + 1];
        int entry[SN_MAXENTRIES];   /* a slot, or -1: a key no line can state */
        double entry_scale[SN_MAXENTRIES];  /* step time keys: seconds per unit */
        double unit_scale[4];       /* ms, us, µs, s */
    } sn_tables;

    typedef struct {
        const unsigned char *t;
        Py_ssize_t n;
        const sn_tables *tab;
        unsigned char have[SN_MAXSLOTS];
        signed char unit[SN_MAXSLOTS];
        double val[SN_MAXSLOTS];
        int rate_state;  /* 0 not searched, 1 none, 2 found */
        int rate_kind;   /* 0 it/s, 1 s/it */
        double rate_val;
        int clu_state;   /* 0 not searched, 1 none, 2 found */
        long long clu_step;
    } sn_scan;

    typedef struct {
        int fmt;
        int step_kind;  /* 0 none, 1 step_i, 2 step_d (an integral float) */
        long long step_i;
        double step_d;
        int has_total;
        long long total;
        int has[7];     /* epoch, loss, grad_norm, loss_scale, lr, step_time_s, throughput */
        double v[7];
        int throughput_unit;  /* -1 `it/s`, else the throughput entry */
        int has_skipped, has_skipped_total, has_rank;
        double skipped, skipped_total;
        long long rank;
    } sn_out;

    enum { F_MEGATRON, F_DS_TIMER, F_DS, F_HF, F_JSON, F_FAIRSEQ, F_CLU, F_LIGHTNING, F_KERAS,
           F_PLAIN };

    /* the first occurrence of lit at or after `from`, or -1 */
    static Py_ssize_t sn_find(const unsigned char *t, Py_ssize_t n, Py_ssize_t from,
                              const char *lit, Py_ssize_t len) {
        while (from + len <= n) {
            const unsigned char *p = memchr(t + from, lit[0], (size_t)(n - len + 1 - from));
            if (!p) return -1;
            if (memcmp(p + 1, lit + 1, (size_t)(len - 1)) == 0) return p - t;
            from = p - t + 1;
        }
        return -1;
    }
    #define SN_HAS(s, lit) (sn_find((s)->t, (s)->n, 0, lit, (Py_ssize_t)sizeof(lit) - 1) >= 0)

    static inline Py_ssize_t sn_digits(const unsigned char *t, Py_ssize_t i, Py_ssize_t n) {
        Py_ssize_t j = i;
        while (j < n && t[j] >= '0' && t[j] <= '9') j++;
        return j - i;
    }

    static inline Py_ssize_t sn_blanks(const unsigned char *t, Py_ssize_t i, Py_ssize_t n) {
        Py_ssize_t j = i;
        while (j < n && (t[j] == ' ' || t[j] == '\\t')) j++;
        return j - i;
    }

    static inline long long sn_int(const unsigned char *t, Py_ssize_t len) {
        long long v = 0;  /* at most 12 digits */
        for (Py_ssize_t i = 0; i < len; i++) v = v * 10 + (t[i] - '0');
        return v;
    }

    static const double SN_POW10[23] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
        1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

    /* float() of the matched text; it cannot fail on what _NUM matches, but the twin's
       `except ValueError` is kept (-1: not a number). Most values take Clinger's fast path:
       digits m < 2^53 and 10^|e| <= 10^22 are exact doubles, so m * 10^e (or m / 10^-e) is
       one correctly rounded operation, which is what CPython's correctly rounded strtod
       gives; everything else (long mantissas, big exponents, nan, inf) goes to CPython. */
    static int sn_float(const unsigned char *t, Py_ssize_t len, double *out) {
    #if FLT_EVAL_METHOD == 0
        Py_ssize_t i = 0;
        int neg = 0, exp10 = 0, digits = 0;
        unsigned long long m = 0;
        if (i < len && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
        for (; i < len && t[i] >= '0' && t[i] <= '9'; i++, digits++) m = m * 10 + (t[i] - '0');
        if (i < len && t[i] == '.')
            for (i++; i < len && t[i] >= '0' && t[i] <= '9'; i++, digits++, exp10--)
                m = m * 10 + (t[i] - '0');
        if (digits && digits <= 19) {  /* no overflow of m yet */
            if (i < len && (t[i] == 'e' || t[i] == 'E')) {
                int eneg = 0, e = 0;
                i++;
                if (i < len && (t[i] == '+' || t[i] == '-')) eneg = t[i++] == '-';
                for (; i < len && t[i] >= '0' && t[i] <= '9'; i++) e = e * 10 + (t[i] - '0');
                exp10 += eneg ? -e : e;  /* at most 3 digits */
            }
            if (i == len && m <= (1ULL << 53) && exp10 >= -22 && exp10 <= 22) {
                double d = (double)m;
                d = exp10 < 0 ? d / SN_POW10[-exp10] : d * SN_POW10[exp10];
                *out = neg ? -d : d;
                return 0;
            }
        }
    #endif
        char buf[64];
        if (len >= (Py_ssize_t)sizeof(buf)) return -1;
        memcpy(buf, t, (size_t)len);
        buf[len] = 0;
        double d = PyOS_string_to_double(buf, NULL, NULL);  /* overflow: inf, as float() */
        if (d == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return -1;
        }
        *out = d;
        return 0;
    }

    /* _UNIT at i, in its order (ms, us, µs, s; they are prefix-free): its index, or -1 */
    static inline int sn_unit(const unsigned char *t, Py_ssize_t i, Py_ssize_t n,
                              Py_ssize_t *len) {
        if (i + 1 < n && t[i + 1] == 's') {
            *len = 2;
            if (t[i] == 'm') return 0;
            if (t[i] == 'u') return 1;
            if (t[i] == SN_MICRO) return 2;
        }
        *len = 1;
        if (i < n && t[i] == 's') return 3;
        return -1;
    }

    enum { SN_LOOK, SN_FULL, SN_RATE };  /* what follows the value: see sn_after */
    typedef struct { Py_ssize_t vs, ve, end; int unit, rate; } sn_val;

    static inline int sn_end_ok(const unsigned char *t, Py_ssize_t i, Py_ssize_t n, int mode) {
        if (mode == SN_FULL) return i == n;
        return i >= n || !(SN_IS(t[i], SN_WORD) || t[i] == '.');  /* (?![\\w.]) */
    }

    /* what follows _NUM: `_UNIT(?![\\w.])` (SN_LOOK), `_UNIT` then the end (SN_FULL, a
       fullmatch), or ` ?(?:it/s|s/it)\\b` (SN_RATE); tried in the regex's order */
    static int sn_after(const unsigned char *t, Py_ssize_t e, Py_ssize_t n, int mode,
                        sn_val *v) {
        if (mode == SN_RATE) {
            for (int spaced = 1; spaced >= 0; spaced--) {
                Py_ssize_t q = e + spaced;
                if (spaced && !(e < n && t[e] == ' ')) continue;
                if (q + 4 > n || (q + 4 < n && SN_IS(t[q + 4], SN_WORD))) continue;
                if (memcmp(t + q, "it/s", 4) == 0) { v->rate = 0; v->end = q + 4; return 1; }
                if (memcmp(t + q, "s/it", 4) == 0) { v->rate = 1; v->end = q + 4; return 1; }
            }
            return 0;
        }
        Py_ssize_t ul;
        int u = sn_unit(t, e, n, &ul);
        if (u >= 0 && sn_end_ok(t, e + ul, n, mode)) {
            v->unit = u;
            v->end = e + ul;
            return 1;
        }
        if (sn_end_ok(t, e, n, mode)) {
            v->unit = -1;
            v->end = e;
            return 1;
        }
        return 0;
    }

    static const char *const SN_WORDS[9] = {
        "nan", "NaN", "NAN", "inf", "Inf", "INF", "infinity", "Infinity", "INFINITY"};
    static const Py_ssize_t SN_WORD_LEN[9] = {3, 3, 3, 3, 3, 3, 8, 8, 8};

    /* _NUM at p, then what `mode` says follows it (the text ends at n). The first alternative
       is read greedily: every shorter reading the regex could backtrack to leaves a digit, '.',
       'e' or 'E' next, which no continuation accepts, so the greedy reading is the only one
       that can match (and when it is cut by a repeat's bound, none can). */
    static int sn_value(const unsigned char *t, Py_ssize_t p, Py_ssize_t n, int mode,
                        sn_val *v) {
        Py_ssize_t i = p, r;
        if (i < n && (t[i] == '+' || t[i] == '-')) i++;
        if (i >= n) return 0;
        v->vs = p;
        if (SN_IS(t[i], SN_DIGIT) || t[i] == '.') {
            if (t[i] == '.') {
                r = sn_digits(t, i + 1, n);
                if (r < 1 || r > 20) return 0;
                i += 1 + r;
            } else {
                r = sn_digits(t, i, n);
                if (r > 20) return 0;
                i += r;
                if (i < n && t[i] == '.') {
                    r = sn_digits(t, i + 1, n);
                    if (r > 20) return 0;
                    i += 1 + r;
                }
            }
            if (i < n && (t[i] == 'e' || t[i] == 'E')) {
                Py_ssize_t j = i + 1;
                if (j < n && (t[j] == '+' || t[j] == '-')) j++;
                r = sn_digits(t, j, n);
                if (r < 1 || r > 3) return 0;
                i = j + r;
            }
            v->ve = i;
            return sn_after(t, i, n, mode, v);
        }
        /* the second alternative starts with n/N/i/I, the first with a digit or '.': only one
           of them can match here; its words are tried in order (`inf` before `infinity`) */
        for (int k = 0; k < 9; k++) {
            Py_ssize_t len = SN_WORD_LEN[k];
            if (i + len <= n && memcmp(t + i, SN_WORDS[k], (size_t)len) == 0
                && sn_after(t, i + len, n, mode, v)) {
                v->ve = i + len;
                return 1;
            }
        }
        return 0;
    }

    static int sn_slot(const sn_tables *tab, const unsigned char *key, Py_ssize_t len) {
        if (len < 1 || len > SN_MAXKEY) return -1;
        for (int k = tab->by_len[len]; k < tab->by_len[len + 1]; k++)
            if (tab->key[k][0] == key[0] && memcmp(tab->key[k], key, (size_t)len) == 0)
                return k;
        return -1;
    }

    /* _put: the key lowercased with single spaces, the first occurrence wins; keys the tables
       do not name are never read, so they are not kept */
    static void sn_put(sn_scan *s, const unsigned char *key, Py_ssize_t klen, const sn_val *v) {
        unsigned char norm[SN_MAXKEY];
        Py_ssize_t m = 0;
        if (klen > SN_MAXKEY) return;
        for (Py_ssize_t i = 0; i < klen; i++) {
            unsigned char c = key[i];
            if (c == ' ' && m > 0 && norm[m - 1] == ' ') continue;
            norm[m++] = (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
        }
        int slot = sn_slot(s->tab, norm, m);
        if (slot < 0 || s->have[slot]) return;
        double d;
        if (sn_float(s->t + v->vs, v->ve - v->vs, &d) < 0) return;
        s->have[slot] = 1;
        s->val[slot] = d;
        s->unit[slot] = (signed char)v->unit;
    }

    static const char *const SN_SPLITS[7] = {
        "val", "eval", "valid", "test", "best", "dev", "validation"};
    static const Py_ssize_t SN_SPLIT_LEN[7] = {3, 4, 5, 4, 4, 3, 10};

    /* _OTHER_SPLIT.search(text, max(0, at - 12), at): `(?:^|[^\\w])word[ \\t]$` ignoring case,
       where `$` is the window's end or just before a newline ending it, and `^` only the
       text's start. (The twin's test for the words in the lowered text is only a shortcut:
       each word holds one.) */
    static int sn_other_split(const unsigned char *t, Py_ssize_t at) {
        Py_ssize_t lo = at > 12 ? at - 12 : 0;
        for (int nl = 0; nl < 2; nl++) {
            Py_ssize_t e = at - nl;  /* where `$` matches */
            if (nl && !(at - 1 >= lo && t[at - 1] == '\\n')) continue;
            if (e - 1 < lo || (t[e - 1] != ' ' && t[e - 1] != '\\t')) continue;
            for (int k = 0; k < 7; k++) {
                Py_ssize_t ws = e - 1 - SN_SPLIT_LEN[k], i;
                if (ws < lo) continue;
                for (i = 0; i < SN_SPLIT_LEN[k]; i++) {
                    unsigned char c = t[ws + i];
                    if (c >= 'A' && c <= 'Z') c += 32;
                    if (c != (unsigned char)SN_SPLITS[k][i]) break;
                }
                if (i < SN_SPLIT_LEN[k]) continue;
                if (ws == 0 || (ws - 1 >= lo && !SN_IS(t[ws - 1], SN_WORD))) return 1;
            }
        }
        return 0;
    }

    /* _segment on text[a:b]: strip, rpartition(" "), the key rstrip(" \\t:") and fullmatched by
       _SEGMENT_KEY, the tail fullmatched by _VALUE */
    static void sn_segment(sn_scan *s, Py_ssize_t a, Py_ssize_t b) {
        const unsigned char *t = s->t;
        while (a < b && SN_IS(t[a], SN_SPACE)) a++;
        while (b > a && SN_IS(t[b - 1], SN_SPACE)) b--;
        Py_ssize_t sp = b - 1;
        while (sp >= a && t[sp] != ' ') sp--;
        if (sp < a) return;  /* no space: the head, so the key, is empty */
        Py_ssize_t ke = sp;
        while (ke > a && (t[ke - 1] == ' ' || t[ke - 1] == '\\t' || t[ke - 1] == ':')) ke--;
        if (ke == a || ke - a > 64 || !SN_IS(t[a], SN_ALPHA)) return;
        for (Py_ssize_t i = a + 1; i < ke; i++)
            if (!SN_IS(t[i], SN_SEGC)) return;
        sn_val v;
        if (sn_value(t, sp + 1, b, SN_FULL, &v)) sn_put(s, t + a, ke - a, &v);
    }

    /* _KV at p: the match's end, or -1 */
    static Py_ssize_t sn_kv_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t p,
                               Py_ssize_t *ks, Py_ssize_t *ke, sn_val *v) {
        Py_ssize_t i = p, r;
        unsigned char q = 0;
        if (p > 0 && (SN_IS(t[p - 1], SN_WORD) || t[p - 1] == '.' || t[p - 1] == '-'))
            return -1;
        /* an opening quote is taken when there: without it the key would start on it */
        if (t[i] == '\\'' || t[i] == '"') q = t[i++];
        if (i >= n || !(SN_IS(t[i], SN_ALPHA) || t[i] == '_')) return -1;
        *ks = i++;
        while (i < n && i - *ks < 64 && SN_IS(t[i], SN_KEYC)) i++;  /* possessive */
        *ke = i;
        if (q) {
            if (i >= n || t[i] != q) return -1;
            i++;
        }
        r = sn_blanks(t, i, n);
        i += r < 4 ? r : 4;
        if (i >= n || (t[i] != ':' && t[i] != '=')) return -1;
        i++;
        r = sn_blanks(t, i, n);
        i += r < 16 ? r : 16;
        /* the optional quote and bracket: not taking one leaves it where _NUM must start */
        if (i < n && (t[i] == '\\'' || t[i] == '"')) i++;
        if (i < n && t[i] == '[') i++;
        if (!sn_value(t, i, n, SN_LOOK, v)) return -1;
        return v->end;
    }

    static void sn_kv(sn_scan *s) {
        const unsigned char *t = s->t;
        Py_ssize_t n = s->n, p = 0, ks, ke, end;
        sn_val v;
        while (p < n) {
            unsigned char c = t[p];
            if (!(SN_IS(c, SN_ALPHA) || c == '_' || c == '\\'' || c == '"')) { p++; continue; }
            end = sn_kv_at(t, n, p, &ks, &ke, &v);
            if (end < 0) { p++; continue; }
            if (!sn_other_split(t, p)) sn_put(s, t + ks, ke - ks, &v);
            p = end;
        }
    }

    /* _PLAIN's key at p (`[Ll]oss|LOSS|[Ii]ter|[Ss]tep|[Ee]poch|lr|LR|[Tt]ime`): its length,
       or 0. At most one alternative matches at a position, so their order is moot. */
    static inline Py_ssize_t sn_plain_key(const unsigned char *t, Py_ssize_t n, Py_ssize_t p) {
        Py_ssize_t room = n - p;
        const unsigned char *k = t + p;
        switch (k[0]) {
        case 'L':
            if (room >= 4 && memcmp(k + 1, "OSS", 3) == 0) return 4;
            if (room >= 2 && k[1] == 'R') return 2;
            /* fall through */
        case 'l':
            if (room >= 4 && memcmp(k + 1, "oss", 3) == 0) return 4;
            if (k[0] == 'l' && room >= 2 && k[1] == 'r') return 2;
            return 0;
        case 'I': case 'i': return room >= 4 && memcmp(k + 1, "ter", 3) == 0 ? 4 : 0;
        case 'S': case 's': return room >= 4 && memcmp(k + 1, "tep", 3) == 0 ? 4 : 0;
        case 'E': case 'e': return room >= 5 && memcmp(k + 1, "poch", 4) == 0 ? 5 : 0;
        case 'T': case 't': return room >= 4 && memcmp(k + 1, "ime", 3) == 0 ? 4 : 0;
        }
        return 0;
    }

    static Py_ssize_t sn_plain_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t p,
                                  Py_ssize_t *klen, sn_val *v) {
        Py_ssize_t len = sn_plain_key(t, n, p), i = p + len, r;
        if (!len || (p > 0 && SN_IS(t[p - 1], SN_WORD))) return -1;  /* \\b before a letter */
        r = sn_blanks(t, i, n);
        if (r < 1) return -1;
        i += r < 8 ? r : 8;  /* possessive */
        if (!sn_value(t, i, n, SN_LOOK, v)) return -1;
        *klen = len;
        return v->end;
    }

    static void sn_plain(sn_scan *s) {
        const unsigned char *t = s->t;
        Py_ssize_t n = s->n, p = 0, klen, end;
        sn_val v;
        while (p < n) {
            end = sn_plain_at(t, n, p, &klen, &v);
            if (end < 0) { p++; continue; }
            /* a filtered match still ends where finditer goes on */
            if (!(p > 0 && (t[p - 1] == '/' || t[p - 1] == '.' || t[p - 1] == '-'
                            || t[p - 1] == '_')) && !sn_other_split(t, p))
                sn_put(s, t + p, klen, &v);
            p = end;
        }
    }

    /* _MEGATRON_ITER.search: every repeat is followed by a character it cannot take, so a
       repeat matches only as the whole run, within its bounds */
    static int sn_megatron(const unsigned char *t, Py_ssize_t n, long long *step,
                           long long *total) {
        Py_ssize_t from = 0, at;
        while ((at = sn_find(t, n, from, "iteration", 9)) >= 0) {
            Py_ssize_t i = at + 9, r, d1;
            from = at + 1;
            if (at > 0 && SN_IS(t[at - 1], SN_WORD)) continue;
            r = sn_blanks(t, i, n);
            if (r < 1 || r > 16) continue;
            i += r;
            d1 = sn_digits(t, i, n);
            if (d1 < 1 || d1 > 12) continue;
            long long a = sn_int(t + i, d1);
            i += d1;
            r = sn_blanks(t, i, n);
            if (r > 8) continue;
            i += r;
            if (i >= n || t[i] != '/') continue;
            i++;
            r = sn_blanks(t, i, n);
            if (r > 12) continue;
            i += r;
            r = sn_digits(t, i, n);
            if (r < 1 || r > 12) continue;
            long long b = sn_int(t + i, r);
            i += r;
            Py_ssize_t bl = sn_blanks(t, i, n);
            if (bl > 4) continue;
            i += bl;
            if (i >= n || t[i] != '|') continue;
            *step = a;
            *total = b;
            return 1;
        }
        return 0;
    }

    static Py_ssize_t sn_keyrun(const unsigned char *t, Py_ssize_t i, Py_ssize_t n) {
        Py_ssize_t j = i;
        while (j < n && SN_IS(t[j], SN_KEYC)) j++;
        return j - i;
    }

    /* ` [A-Za-z_][\\w/.\\-]{0,63}=` at j */
    static int sn_clu_key(const unsigned char *t, Py_ssize_t n, Py_ssize_t j) {
        if (j + 1 >= n || t[j] != ' ' || !(SN_IS(t[j + 1], SN_ALPHA) || t[j + 1] == '_'))
            return 0;
        Py_ssize_t r = sn_keyrun(t, j + 2, n);
        return r <= 63 && j + 2 + r < n && t[j + 2 + r] == '=';
    }

    /* _CLU_STEP after its `^` or `] `, at i */
    static int sn_clu_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t i, long long *step) {
        if (i >= n || t[i] != '[') return 0;
        Py_ssize_t d = sn_digits(t, i + 1, n), j = i + 2 + d;
        if (d < 1 || d > 12 || i + 1 + d >= n || t[i + 1 + d] != ']') return 0;
        int ok = 0;
        /* with the optional ` collection=…` first; without it, ` collection=` can itself be
           the ` key=` */
        if (n - j >= 12 && memcmp(t + j, " collection=", 12) == 0) {
            Py_ssize_t r = sn_keyrun(t, j + 12, n);
            ok = r >= 1 && r <= 64 && sn_clu_key(t, n, j + 12 + r);
        }
        if (!ok) ok = sn_clu_key(t, n, j);
        if (ok) *step = sn_int(t + i + 1, d);
        return ok;
    }

    static int sn_clu(sn_scan *s) {
        if (!s->clu_state) {
            const unsigned char *t = s->t;
            Py_ssize_t n = s->n, from = 0, at;
            int found = sn_clu_at(t, n, 0, &s->clu_step);
            while (!found && (at = sn_find(t, n, from, "] ", 2)) >= 0) {
                found = sn_clu_at(t, n, at + 2, &s->clu_step);
                from = at + 1;
            }
            s->clu_state = found ? 2 : 1;
        }
        return s->clu_state == 2;
    }

    /* _RATE.search, once: its first match, whichever of it/s and s/it it is */
    static int sn_rate(sn_scan *s) {
        if (!s->rate_state) {
            const unsigned char *t = s->t;
            Py_ssize_t n = s->n;
            sn_val v;
            s->rate_state = 1;
            for (Py_ssize_t p = 0; p < n; p++) {
                unsigned char c = t[p];
                if (!(SN_IS(c, SN_DIGIT) || c == '.' || c == '+' || c == '-' || c == 'n'
                      || c == 'N' || c == 'i' || c == 'I')) continue;
                if (p > 0 && (SN_IS(t[p - 1], SN_WORD) || t[p - 1] == '.')) continue;
                if (!sn_value(t, p, n, SN_RATE, &v)) continue;
                if (sn_float(t + v.vs, v.ve - v.vs, &s->rate_val) < 0) break;
                s->rate_kind = v.rate;
                s->rate_state = 2;
                break;
            }
        }
        return s->rate_state == 2;
    }

    /* _PER_STEP.search: seconds, or -1 when none */
    static int sn_per_step(sn_scan *s, double *seconds) {
        const unsigned char *t = s->t;
        Py_ssize_t n = s->n;
        for (Py_ssize_t p = 0; p < n; p++) {
            if (!SN_IS(t[p], SN_DIGIT)) continue;
            if (p > 0 && (SN_IS(t[p - 1], SN_WORD) || t[p - 1] == '.')) continue;
            Py_ssize_t r = sn_digits(t, p, n), i = p + r, ul;
            if (r > 9) continue;
            if (i < n && t[i] == '.') {
                r = sn_digits(t, i + 1, n);
                if (r < 1 || r > 9) continue;  /* no fraction leaves the '.' before a unit */
                i += 1 + r;
            }
            int u = sn_unit(t, i, n, &ul);
            if (u < 0) continue;
            Py_ssize_t j = i + ul;
            if (j + 5 > n || memcmp(t + j, "/step", 5) != 0) continue;
            if (j + 5 < n && SN_IS(t[j + 5], SN_WORD)) continue;
            double d;
            if (sn_float(t + p, i - p, &d) < 0) return 0;
            *seconds = d * s->tab->unit_scale[u];
            return 1;
        }
        return 0;
    }

    static int sn_fairseq_epoch(const unsigned char *t, Py_ssize_t n) {
        Py_ssize_t from = 0, at;
        while ((at = sn_find(t, n, from, "epoch ", 6)) >= 0) {
            Py_ssize_t i = at + 6, r;
            from = at + 1;
            if (at > 0 && SN_IS(t[at - 1], SN_WORD)) continue;
            r = sn_digits(t, i, n);
            if (r < 1 || r > 6 || i + r >= n || t[i + r] != ':') continue;
            i += r + 1;
            r = sn_blanks(t, i, n);
            if (r < 1 || r > 12) continue;
            i += r;
            r = sn_digits(t, i, n);
            if (r < 1 || r > 12 || i + r + 3 > n || memcmp(t + i + r, " / ", 3) != 0) continue;
            i += r + 3;
            r = sn_digits(t, i, n);
            if (r < 1 || r > 12) continue;
            i += r;
            if (i < n && SN_IS(t[i], SN_WORD)) continue;
            return 1;
        }
        return 0;
    }

    /* `epoch \\d{1,6} \\|` at i */
    static int sn_fairseq_print_at(const unsigned char *t, Py_ssize_t n, Py_ssize_t i) {
        if (i + 6 > n || memcmp(t + i, "epoch ", 6) != 0) return 0;
        Py_ssize_t r = sn_digits(t, i + 6, n);
        return r >= 1 && r <= 6 && i + 6 + r + 2 <= n && memcmp(t + i + 6 + r, " |", 2) == 0;
    }

    /* _FAIRSEQ_PRINT.search(text.lstrip()) */
    static int sn_fairseq_print(const unsigned char *t, Py_ssize_t n) {
        Py_ssize_t s0 = 0, from, at;
        while (s0 < n && SN_IS(t[s0], SN_SPACE)) s0++;
        if (sn_fairseq_print_at(t, n, s0)) return 1;
        for (from = s0; (at = sn_find(t, n, from, "| ", 2)) >= 0; from = at + 1)
            if (sn_fairseq_print_at(t, n, at + 2)) return 1;
        return 0;
    }

    static int sn_bar(const unsigned char *t, Py_ssize_t n) {
        for (Py_ssize_t p = 0; p < n; p++) {
            if (!SN_IS(t[p], SN_DIGIT)) continue;
            if (p > 0 && (SN_IS(t[p - 1], SN_WORD) || t[p - 1] == '/' || t[p - 1] == '.'))
                continue;
            Py_ssize_t r = sn_digits(t, p, n), i = p + r;
            if (r > 9 || i >= n || t[i] != '/') continue;
            r = sn_digits(t, i + 1, n);
            i += 1 + r;
            if (r < 1 || r > 9 || i + 1 >= n || t[i] != ' ') continue;
            if (t[i + 1] == '[' || t[i + 1] == SN_BOX) return 1;
        }
        return 0;
    }

    static int sn_rank(const unsigned char *t, Py_ssize_t n, long long *rank) {
        Py_ssize_t from = 0, at;
        while ((at = sn_find(t, n, from, "[Rank ", 6)) >= 0) {
            Py_ssize_t r = sn_digits(t, at + 6, n);
            from = at + 1;
            if (r >= 1 && r <= 7 && at + 6 + r < n && t[at + 6 + r] == ']') {
                *rank = sn_int(t + at + 6, r);
                return 1;
            }
        }
        return 0;
    }

    /* _first(pairs, role): the first key of the role that the line states (its value may be
       nan: the next key is not looked at); its slot or -1 */
    static int sn_first(const sn_scan *s, int role) {
        const sn_tables *tab = s->tab;
        for (int k = tab->role_start[role]; k < tab->role_start[role + 1]; k++) {
            int slot = tab->entry[k];
            if (slot >= 0 && s->have[slot]) return slot;
        }
        return -1;
    }

    static inline int sn_count(double v) {  /* _count */
        return isfinite(v) && v >= 0 && v == floor(v);
    }

    static int sn_format(sn_scan *s, int megatron) {
        const unsigned char *t = s->t;
        Py_ssize_t n = s->n;
        if (megatron) return F_MEGATRON;
        if (SN_HAS(s, "SamplesPerSec=")) return F_DS_TIMER;
        if (SN_HAS(s, "skipped=") && SN_HAS(s, "step=")) return F_DS;
        if (SN_HAS(s, "{'")) return F_HF;
        if (SN_HAS(s, "{\\"")) return F_JSON;
        if (SN_HAS(s, "epoch ") && (sn_fairseq_epoch(t, n) || sn_fairseq_print(t, n)))
            return F_FAIRSEQ;
        if (SN_HAS(s, "[") && sn_clu(s)) return F_CLU;
        if (SN_HAS(s, "v_num=") || SN_HAS(s, "it/s") || SN_HAS(s, "s/it")) return F_LIGHTNING;
        if (SN_HAS(s, "/step") || SN_HAS(s, " - loss: ") || (SN_HAS(s, "/") && sn_bar(t, n)))
            return F_KERAS;
        return F_PLAIN;
    }

    /* parse_candidate on the text (one byte a character): 1 numbers in *o, 0 none */
    static int sn_parse(const sn_tables *tab, const unsigned char *t, Py_ssize_t n, sn_out *o) {
        sn_scan s;
        s.t = t;
        s.n = n;
        s.tab = tab;
        s.rate_state = s.clu_state = 0;
        memset(s.have, 0, (size_t)tab->nslots);
        memset(o, 0, sizeof(*o));

        Py_ssize_t bars = 0;
        for (const unsigned char *p = t; (p = memchr(p, '|', (size_t)(t + n - p))); p++) bars++;
        if (bars >= 2) {
            Py_ssize_t a = 0;
            for (;;) {
                const unsigned char *bar = memchr(t + a, '|', (size_t)(n - a));
                Py_ssize_t b = bar ? bar - t : n;
                sn_segment(&s, a, b);
                if (!bar) break;
                a = b + 1;
            }
        }
        if (memchr(t, '=', (size_t)n) || memchr(t, ':', (size_t)n)) sn_kv(&s);
        sn_plain(&s);
        if (sn_first(&s, R_SUMMARY) >= 0) return 0;

        long long mstep = 0, mtotal = 0;
        int megatron = sn_megatron(t, n, &mstep, &mtotal);
        o->fmt = sn_format(&s, megatron);
        int slot;
        if (megatron) {
            o->step_kind = 1;
            o->step_i = mstep;
            o->has_total = 1;
            o->total = mtotal;
        } else {
            slot = sn_first(&s, R_STEP);
            if (slot >= 0 && sn_count(s.val[slot])) {
                o->step_kind = 2;
                o->step_d = s.val[slot];
            } else if (memchr(t, '[', (size_t)n) && sn_clu(&s)) {
                o->step_kind = 1;
                o->step_i = s.clu_step;
            }
        }
        slot = sn_first(&s, R_EPOCH);
        if (slot >= 0 && isfinite(s.val[slot])) { o->has[0] = 1; o->v[0] = s.val[slot]; }
        static const int value_roles[4] = {R_LOSS, R_GRAD, R_SCALE, R_LR};
        for (int k = 0; k < 4; k++) {
            slot = sn_first(&s, value_roles[k]);
            if (slot >= 0) { o->has[1 + k] = 1; o->v[1 + k] = s.val[slot]; }
        }

        /* step time: a step time key (its unit, else the key's own scale), `time` with a
           unit, Keras' `12ms/step`, tqdm's `s/it` */
        for (int k = tab->role_start[R_STEPTIME]; k < tab->role_start[R_STEPTIME + 1]; k++) {
            slot = tab->entry[k];
            if (slot < 0 || !s.have[slot]) continue;
            int u = s.unit[slot];
            o->has[5] = 1;
            o->v[5] = s.val[slot] * (u >= 0 ? tab->unit_scale[u] : tab->entry_scale[k]);
            break;
        }
        if (!o->has[5]) {
            slot = sn_first(&s, R_TIME);
            if (slot >= 0 && s.unit[slot] >= 0) {
                o->has[5] = 1;
                o->v[5] = s.val[slot] * tab->unit_scale[(int)s.unit[slot]];
            } else if (SN_HAS(&s, "/step") && sn_per_step(&s, &o->v[5])) {
                o->has[5] = 1;
            } else if (SN_HAS(&s, "s/it") && sn_rate(&s) && s.rate_kind == 1) {
                o->has[5] = 1;
                o->v[5] = s.rate_val;
            }
        }

        for (int k = tab->role_start[R_THROUGHPUT]; k < tab->role_start[R_THROUGHPUT + 1];
             k++) {
            slot = tab->entry[k];
            if (slot < 0 || !s.have[slot]) continue;
            o->has[6] = 1;
            o->v[6] = s.val[slot];
            o->throughput_unit = k - tab->role_start[R_THROUGHPUT];
            break;
        }
        if (!o->has[6] && SN_HAS(&s, "it/s") && sn_rate(&s) && s.rate_kind == 0) {
            o->has[6] = 1;
            o->v[6] = s.rate_val;
            o->throughput_unit = -1;
        }

        slot = sn_first(&s, R_NSKIPPED);
        if (slot >= 0 && sn_count(s.val[slot])) { o->has_skipped = 1; o->skipped = s.val[slot]; }
        slot = sn_first(&s, R_SKIPPED);
        if (slot >= 0 && sn_count(s.val[slot])) {
            o->has_skipped_total = 1;
            o->skipped_total = s.val[slot];
        }
        o->has_rank = SN_HAS(&s, "[Rank ") && sn_rank(t, n, &o->rank);

        if (o->has[1] || o->has[2] || o->has[3] || o->has[5] || o->has[6]
            || o->has_skipped_total)
            return 1;
        /* a step alone says training progressed (DeepSpeed's step= lines) */
        return o->step_kind && o->fmt != F_PLAIN && o->fmt != F_KERAS && o->fmt != F_LIGHTNING;
    }

    /* the part of head = line[:limit] that parse_candidate reads: of a progress bar redrawn
       with carriage returns, the text after the last one that ends no state */
    static void sn_head(const unsigned char *s, Py_ssize_t n, Py_ssize_t *start,
                        Py_ssize_t *end) {
        *start = 0;
        *end = n;
        if (!memchr(s, '\\r', (size_t)n)) return;
        while (*end > 0 && s[*end - 1] == '\\r') (*end)--;
        for (Py_ssize_t i = *end; i > 0; i--)
            if (s[i - 1] == '\\r') { *start = i; return; }
    }

    static int sn_is_ascii(const unsigned char *s, Py_ssize_t n) {
        unsigned char any = 0;
        for (Py_ssize_t i = 0; i < n; i++) any |= s[i];
        return !(any & 0x80);
    }

    /* the decoded text, one byte a character; -1 when a character needs the twin */
    static int sn_map(PyObject *text, unsigned char *out) {
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        for (Py_ssize_t i = 0; i < len; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c < 0x80) out[i] = (unsigned char)c;
            else if (c == 0x2501) out[i] = SN_BOX;
            else if (c == 0xB5) out[i] = SN_MICRO;
            else if (Py_UNICODE_ISALNUM(c) || Py_UNICODE_ISSPACE(c)) return -1;
            else out[i] = SN_OTHER;
        }
        return 0;
    }
    """
    enum:
        SN_OTHER
        SN_MICRO
        SN_MAXKEY
        SN_MAXSLOTS
        SN_MAXENTRIES
        R_LOSS
        R_GRAD
        R_SCALE
        R_LR
        R_STEP
        R_STEPTIME
        R_THROUGHPUT
        R_SUMMARY
        R_EPOCH
        R_TIME
        R_NSKIPPED
        R_SKIPPED
        R_COUNT

    ctypedef struct sn_tables:
        int nslots
        unsigned char key[SN_MAXSLOTS][SN_MAXKEY]
        int by_len[SN_MAXKEY + 2]
        int role_start[R_COUNT + 1]
        int entry[SN_MAXENTRIES]
        double entry_scale[SN_MAXENTRIES]
        double unit_scale[4]

    ctypedef struct sn_out:
        int fmt
        int step_kind
        long long step_i
        double step_d
        int has_total
        long long total
        int has[7]
        double v[7]
        int throughput_unit
        int has_skipped
        int has_skipped_total
        int has_rank
        double skipped
        double skipped_total
        long long rank

    void sn_init_classes()
    int sn_parse(const sn_tables* tab, const unsigned char* t, Py_ssize_t n, sn_out* o)
    void sn_head(const unsigned char* s, Py_ssize_t n, Py_ssize_t* start, Py_ssize_t* end)
    int sn_is_ascii(const unsigned char* s, Py_ssize_t n)
    int sn_map(object text, unsigned char* out)

sn_init_classes()

# indexed by sn_out.fmt
_FORMATS = (
    "megatron", "deepspeed_timer", "deepspeed", "hf", "json", "fairseq", "clu", "lightning",
    "keras", "plain",
)
_UNITS = ("ms", "us", "µs", "s")  # _UNIT's order


cdef int _encode_key(object key, unsigned char* out) except -2:
    """The key as the scan sees it (µ its own byte), its length; -1: no line can state it."""
    if not isinstance(key, str) or not 1 <= len(key) <= SN_MAXKEY:
        return -1
    cdef Py_ssize_t i = 0
    for ch in key:
        if ch == "µ":
            out[i] = SN_MICRO
        elif ord(ch) < 0x80:
            out[i] = ord(ch)
        else:
            return -1
        i += 1
    return i


cdef class StepParser:
    """See `denpex._native.stepnumbers_ref.StepParser`: the same tables, the same results."""

    cdef sn_tables* _tab
    cdef readonly Py_ssize_t parse_limit
    cdef readonly long long fallbacks
    cdef tuple _args
    cdef object _ref
    cdef tuple _throughput_units

    def __cinit__(self, loss_keys, grad_norm_keys, loss_scale_keys, lr_keys, step_keys,
                  step_time_keys, throughput_keys, unit_seconds, summary_keys,
                  Py_ssize_t parse_limit):
        if parse_limit < 0:
            raise ValueError("parse_limit must be at least 0 bytes")
        cdef unsigned char buf[SN_MAXKEY]
        cdef int length, k, e = 0
        step_time = dict(step_time_keys)
        throughput = dict(throughput_keys)
        units = dict(unit_seconds)
        missing = [u for u in _UNITS if u not in units]
        if missing:
            raise ValueError(f"unit_seconds lacks {', '.join(missing)}")
        roles = [
            tuple(loss_keys), tuple(grad_norm_keys), tuple(loss_scale_keys), tuple(lr_keys),
            tuple(step_keys), tuple(step_time), tuple(throughput), tuple(summary_keys),
            ("epoch",), ("time",), ("number of skipped iterations",), ("skipped",),
        ]
        self._args = (roles[0], roles[1], roles[2], roles[3], roles[4], step_time, throughput,
                      units, roles[7], parse_limit)
        self._throughput_units = tuple(throughput.values())
        self.parse_limit = parse_limit
        self._tab = <sn_tables*>malloc(sizeof(sn_tables))
        if self._tab == NULL:
            raise MemoryError()
        encoded = {}
        for role in roles:
            for key in role:
                length = _encode_key(key, buf)
                if length > 0:
                    encoded.setdefault(key, (<char*>buf)[:length])
        keys = sorted(set(encoded.values()), key=len)
        if len(keys) > SN_MAXSLOTS or sum(len(r) for r in roles) > SN_MAXENTRIES:
            raise ValueError("more keys than the native parser holds")
        slots = {}
        self._tab.nslots = len(keys)
        for k in range(SN_MAXKEY + 2):
            self._tab.by_len[k] = 0
        for k, raw in enumerate(keys):
            slots[raw] = k
            for i in range(len(raw)):
                self._tab.key[k][i] = raw[i]
        for k in range(SN_MAXKEY + 2):  # by_len[L]: the first slot of length >= L
            self._tab.by_len[k] = sum(1 for raw in keys if len(raw) < k)
        for r in range(R_COUNT):
            self._tab.role_start[r] = e
            for key in roles[r]:
                self._tab.entry[e] = slots[encoded[key]] if key in encoded else -1
                self._tab.entry_scale[e] = float(step_time[key]) if r == R_STEPTIME else 0.0
                e += 1
        self._tab.role_start[R_COUNT] = e
        for k in range(4):
            self._tab.unit_scale[k] = float(units[_UNITS[k]])
        self.fallbacks = 0

    def __dealloc__(self):
        free(self._tab)

    def parse(self, line):
        """The StepNumbers fields of one line already known to hold a literal."""
        if type(line) is not bytes:
            return self._fallback(line)
        cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(line)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(line)
        cdef Py_ssize_t start, end, length
        cdef sn_out o
        cdef int rc
        cdef unsigned char local[4096]
        cdef unsigned char* mapped
        if n > self.parse_limit:
            n = self.parse_limit
        sn_head(s, n, &start, &end)
        if sn_is_ascii(s + start, end - start):
            rc = sn_parse(self._tab, s + start, end - start, &o)
        else:
            text = PyUnicode_DecodeUTF8(<char*>s + start, end - start, "replace")
            length = PyUnicode_GET_LENGTH(text)
            mapped = &local[0]
            if length > 4096:
                mapped = <unsigned char*>malloc(length)
                if mapped == NULL:
                    raise MemoryError()
            try:
                if sn_map(text, mapped) < 0:
                    return self._fallback(line)
                rc = sn_parse(self._tab, mapped, length, &o)
            finally:
                if mapped != &local[0]:
                    free(mapped)
        if rc == 0:
            return None
        return self._fields(&o)

    cdef tuple _fields(self, sn_out* o):
        if o.step_kind == 1:
            step = PyLong_FromLongLong(o.step_i)
        elif o.step_kind == 2:
            step = PyLong_FromDouble(o.step_d)
        else:
            step = None
        if o.has[6]:
            unit = "it/s" if o.throughput_unit < 0 else self._throughput_units[o.throughput_unit]
        else:
            unit = None
        return (
            _FORMATS[o.fmt],
            step,
            PyLong_FromLongLong(o.total) if o.has_total else None,
            o.v[0] if o.has[0] else None,
            o.v[1] if o.has[1] else None,
            o.v[2] if o.has[2] else None,
            o.v[3] if o.has[3] else None,
            o.v[4] if o.has[4] else None,
            o.v[5] if o.has[5] else None,
            o.v[6] if o.has[6] else None,
            unit,
            PyLong_FromDouble(o.skipped) if o.has_skipped else None,
            PyLong_FromDouble(o.skipped_total) if o.has_skipped_total else None,
            PyLong_FromLongLong(o.rank) if o.has_rank else None,
        )

    def _fallback(self, line):
        if self._ref is None:
            from denpex._native.stepnumbers_ref import StepParser as ReferenceParser

            self._ref = ReferenceParser(*self._args)
        self.fallbacks += 1
        return self._ref.parse(line)
