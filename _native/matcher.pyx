# cython: language_level=3
"""Native multi-pattern matcher, same API and results as `denpex._native.matcher_ref`.

Per 64 KB block, GIL released: hashed 4-byte windows at every 4th position find the literals of
>= 7 bytes, Teddy (SIMD nibble masks) the 3-6 byte ones; a literal hit must pass a small program
for the regex items around it, then `LineSearch` (`re`, RE2 on long lines) confirms that
(line, pattern) pair only. It must never
miss a pair that `re.search` on that line finds, nor report one it does not.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

from denpex._native.contexts import matcher_plan
from denpex._native.linesearch import LineSearch

cdef extern from *:
    """
    #include <stdint.h>
    #include <stdlib.h>
    #include <string.h>
    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    #define DX_TEDDY 1
    #endif

    #define DX_EXPECT0(x) __builtin_expect(!!(x), 0)
    #define DX_TEDDY_MAX 48  /* more 3-6 byte literals than this: the hashed pass takes them */

    /* A hashed-window table: a bitmap filter over 4-byte windows, then an exact lookup of the
       window among the registered ones, each naming (literal, offset of the window in it). */
    typedef struct {
        uint32_t bits, kbits, stride;
        uint8_t *bitmap;
        uint32_t *kkey;
        int32_t *kstart, *kcount;  /* kcount 0: empty slot */
        int32_t *ent_lit, *ent_off;
    } dx_win;

    typedef struct {
        dx_win win[2];         /* 0: literals of >= 7 bytes, every 4th position; 1: 3-6 bytes */
        int32_t nlit;
        uint8_t *litdata;
        int64_t *litpos;
        int32_t *litlen;
        uint8_t *licase;       /* literal stored lowercase, compared ASCII case-insensitively */
        int32_t *lp_start;     /* literal -> patterns, CSR (nlit + 1 entries) */
        int32_t *lp_pat;
        int32_t ntiny;         /* literals of 1-2 bytes (never in the shipped catalog) */
        int32_t *tiny_lit;
        uint8_t tiny_first[256];
        int32_t nteddy;        /* literals of 3-6 bytes for the SIMD pass, in 8 buckets */
        uint8_t teddy_mask[6][16];  /* (low, high nibble) x first 3 bytes -> bucket bits */
        int32_t teddy_start[9];
        int32_t teddy_lit[DX_TEDDY_MAX];
        int32_t npat;
        int32_t *lp_ctx;       /* literal-pattern pair k -> contexts [lp_ctx[k], lp_ctx[k + 1]) */
        int32_t *ctx_head;     /* program entries: backwards from the literal, forwards after */
        int32_t *ctx_tail;
        uint8_t *prog_op;
        int32_t *prog_a, *prog_b, *prog_c;
        uint8_t *sets;         /* 32 bytes (256 bits) per byte set */
    } dx_tab;

    typedef struct { int64_t pos; int32_t lit; } dx_hit;
    typedef struct { dx_hit *v; size_t n, cap; } dx_hits;
    typedef struct { int64_t line, begin, end; int32_t pat; } dx_cand;
    typedef struct { dx_cand *v; size_t n, cap; } dx_cands;

    static uint8_t dx_lower[256];
    static int dx_simd = 0;

    static void dx_init(void) {
        for (int c = 0; c < 256; c++)
            dx_lower[c] = (uint8_t)((c >= 'A' && c <= 'Z') ? c + 32 : c);
    #ifdef DX_TEDDY
        __builtin_cpu_init();
        dx_simd = __builtin_cpu_supports("ssse3");
    #endif
    }

    static inline uint32_t dx_hash(uint32_t w, uint32_t bits) {
        return (w * 2654435761u) >> (32 - bits);
    }

    static inline uint32_t dx_khash(uint32_t w, uint32_t kbits) {
        return ((w ^ (w >> 15)) * 2246822519u) >> (32 - kbits);
    }

    static void dx_key_insert(dx_win *t, uint32_t w, int32_t start, int32_t count) {
        uint32_t h = dx_hash(w, t->bits);
        t->bitmap[h >> 3] |= (uint8_t)(1u << (h & 7));
        uint32_t mask = (1u << t->kbits) - 1, s = dx_khash(w, t->kbits);
        while (t->kcount[s]) s = (s + 1) & mask;
        t->kkey[s] = w; t->kstart[s] = start; t->kcount[s] = count;
    }

    static inline int dx_verify(const dx_tab *t, const uint8_t *p, int64_t n, int64_t start,
                                int32_t lit) {
        int32_t len = t->litlen[lit];
        if (start < 0 || start + len > n) return 0;
        const uint8_t *l = t->litdata + t->litpos[lit];
        const uint8_t *s = p + start;
        if (!t->licase[lit]) return memcmp(s, l, (size_t)len) == 0;
        for (int32_t j = 0; j < len; j++)
            if (dx_lower[s[j]] != l[j]) return 0;
        return 1;
    }

    static int dx_push_hit(dx_hits *h, int64_t pos, int32_t lit) {
        if (h->n == h->cap) {
            size_t cap = h->cap ? h->cap * 2 : 256;
            dx_hit *v = (dx_hit *)realloc(h->v, cap * sizeof(dx_hit));
            if (!v) return -1;
            h->v = v; h->cap = cap;
        }
        h->v[h->n].pos = pos; h->v[h->n].lit = lit; h->n++;
        return 0;
    }

    static int dx_push_cand(dx_cands *c, int64_t line, int64_t begin, int64_t end, int32_t pat) {
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 256;
            dx_cand *v = (dx_cand *)realloc(c->v, cap * sizeof(dx_cand));
            if (!v) return -1;
            c->v = v; c->cap = cap;
        }
        dx_cand *x = &c->v[c->n++];
        x->line = line; x->begin = begin; x->end = end; x->pat = pat;
        return 0;
    }

    /* the window at i (value w) passed the filter: look it up exactly, verify its literals */
    static int dx_probe(const dx_tab *t, const dx_win *win, const uint8_t *p, int64_t n,
                        int64_t i, uint32_t w, dx_hits *out) {
        uint32_t mask = (1u << win->kbits) - 1, s = dx_khash(w, win->kbits);
        while (win->kcount[s]) {
            if (win->kkey[s] == w) {
                for (int32_t e = win->kstart[s]; e < win->kstart[s] + win->kcount[s]; e++) {
                    int64_t start = i - win->ent_off[e];
                    if (dx_verify(t, p, n, start, win->ent_lit[e])
                        && dx_push_hit(out, start, win->ent_lit[e]))
                        return -1;
                }
                return 0;
            }
            s = (s + 1) & mask;
        }
        return 0;
    }

    /* Windows starting at every stride-th position in [lo, hi) (lo a multiple of 4). With
       stride 4 a literal of >= 7 bytes registers the 4 windows at offsets b..b+3, one of which
       starts at a multiple of 4; with stride 1 a 3-byte literal registers every 4th byte after
       it, and the last windows of the buffer are zero-padded. */
    static int dx_scan_windows(const dx_tab *t, const dx_win *win, const uint8_t *p, int64_t n,
                               int64_t lo, int64_t hi, dx_hits *out) {
        const uint32_t bits = win->bits;
        const uint8_t *bm = win->bitmap;
        int64_t i = lo;
        if (win->stride == 4) {
            for (; i + 16 <= hi && i + 16 <= n; i += 16) {
                uint32_t w0, w1, w2, w3;
                memcpy(&w0, p + i, 4); memcpy(&w1, p + i + 4, 4);
                memcpy(&w2, p + i + 8, 4); memcpy(&w3, p + i + 12, 4);
                uint32_t h0 = dx_hash(w0, bits), h1 = dx_hash(w1, bits);
                uint32_t h2 = dx_hash(w2, bits), h3 = dx_hash(w3, bits);
                int any = ((bm[h0 >> 3] >> (h0 & 7)) | (bm[h1 >> 3] >> (h1 & 7))
                           | (bm[h2 >> 3] >> (h2 & 7)) | (bm[h3 >> 3] >> (h3 & 7))) & 1;
                if (DX_EXPECT0(any)) {
                    if (((bm[h0 >> 3] >> (h0 & 7)) & 1) && dx_probe(t, win, p, n, i, w0, out))
                        return -1;
                    if (((bm[h1 >> 3] >> (h1 & 7)) & 1) && dx_probe(t, win, p, n, i + 4, w1, out))
                        return -1;
                    if (((bm[h2 >> 3] >> (h2 & 7)) & 1) && dx_probe(t, win, p, n, i + 8, w2, out))
                        return -1;
                    if (((bm[h3 >> 3] >> (h3 & 7)) & 1) && dx_probe(t, win, p, n, i + 12, w3, out))
                        return -1;
                }
            }
            for (; i < hi && i + 4 <= n; i += 4) {
                uint32_t w;
                memcpy(&w, p + i, 4);
                uint32_t h = dx_hash(w, bits);
                if (((bm[h >> 3] >> (h & 7)) & 1) && dx_probe(t, win, p, n, i, w, out))
                    return -1;
            }
            return 0;
        }
        for (; i < hi && i + 4 <= n; i++) {
            uint32_t w;
            memcpy(&w, p + i, 4);
            uint32_t h = dx_hash(w, bits);
            if (DX_EXPECT0((bm[h >> 3] >> (h & 7)) & 1))
                if (dx_probe(t, win, p, n, i, w, out)) return -1;
        }
        for (; i < hi; i++) {
            uint8_t tail[4] = {0, 0, 0, 0};
            uint32_t w;
            memcpy(tail, p + i, (size_t)(n - i));
            memcpy(&w, tail, 4);
            uint32_t h = dx_hash(w, bits);
            if (((bm[h >> 3] >> (h & 7)) & 1) && dx_probe(t, win, p, n, i, w, out)) return -1;
        }
        return 0;
    }

    static int dx_teddy_verify(const dx_tab *t, const uint8_t *p, int64_t n, int64_t i,
                               unsigned buckets, dx_hits *out) {
        while (buckets) {
            int b = __builtin_ctz(buckets);
            buckets &= buckets - 1;
            for (int32_t k = t->teddy_start[b]; k < t->teddy_start[b + 1]; k++)
                if (dx_verify(t, p, n, i, t->teddy_lit[k]) && dx_push_hit(out, i, t->teddy_lit[k]))
                    return -1;
        }
        return 0;
    }

    static inline unsigned dx_teddy_scalar(const dx_tab *t, const uint8_t *p, int64_t n,
                                           int64_t i) {
        unsigned r = 0xff;
        for (int j = 0; j < 3; j++) {
            if (i + j >= n) return 0;
            uint8_t c = p[i + j];
            r &= t->teddy_mask[2 * j][c & 15] & t->teddy_mask[2 * j + 1][c >> 4];
        }
        return r;
    }

    static int dx_scan_teddy_portable(const dx_tab *t, const uint8_t *p, int64_t n,
                                      int64_t lo, int64_t hi, dx_hits *out) {
        for (int64_t i = lo; i < hi; i++) {
            unsigned r = dx_teddy_scalar(t, p, n, i);
            if (r && dx_teddy_verify(t, p, n, i, r, out)) return -1;
        }
        return 0;
    }

    #ifdef DX_TEDDY
    /* Teddy (as in Hyperscan): 16 positions at once, each of the first three bytes of a
       literal looked up by nibble in two 16-byte tables of bucket bits; a position keeps the
       buckets whose three bytes all fit, then each literal of those buckets is compared. */
    __attribute__((target("ssse3")))
    static int dx_scan_teddy(const dx_tab *t, const uint8_t *p, int64_t n, int64_t lo,
                             int64_t hi, dx_hits *out) {
        const __m128i nib = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
        __m128i m[6];
        for (int j = 0; j < 6; j++) m[j] = _mm_loadu_si128((const __m128i *)t->teddy_mask[j]);
        int64_t i = lo;
        uint8_t r8[16];
        for (; i + 16 <= hi && i + 18 <= n; i += 16) {
            __m128i r = _mm_set1_epi8((char)0xff);
            for (int j = 0; j < 3; j++) {
                __m128i v = _mm_loadu_si128((const __m128i *)(p + i + j));
                __m128i l = _mm_shuffle_epi8(m[2 * j], _mm_and_si128(v, nib));
                __m128i h = _mm_shuffle_epi8(m[2 * j + 1], _mm_and_si128(_mm_srli_epi16(v, 4), nib));
                r = _mm_and_si128(r, _mm_and_si128(l, h));
            }
            unsigned mask = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(r, zero)) ^ 0xffffu;
            if (DX_EXPECT0(mask)) {
                _mm_storeu_si128((__m128i *)r8, r);
                while (mask) {
                    int k = __builtin_ctz(mask);
                    mask &= mask - 1;
                    if (dx_teddy_verify(t, p, n, i + k, r8[k], out)) return -1;
                }
            }
        }
        return dx_scan_teddy_portable(t, p, n, i, hi, out);
    }
    #endif

    /* literals of 1-2 bytes: a first-byte table, then compare */
    static int dx_scan_tiny(const dx_tab *t, const uint8_t *p, int64_t n, int64_t lo,
                            int64_t hi, dx_hits *out) {
        for (int64_t i = lo; i < hi; i++) {
            if (!t->tiny_first[p[i]]) continue;
            for (int32_t k = 0; k < t->ntiny; k++) {
                int32_t lit = t->tiny_lit[k];
                if (dx_verify(t, p, n, i, lit) && dx_push_hit(out, i, lit)) return -1;
            }
        }
        return 0;
    }

    enum { DX_CHAR, DX_REP, DX_SPLIT, DX_JMP, DX_ACCEPT };
    #define DX_STACK 256
    #define DX_BUDGET 4096
    #define DX_IN(t, s, c) (((t)->sets[(size_t)(s) * 32 + ((c) >> 3)] >> ((c) & 7)) & 1)

    /* Run one direction of a context program at pos (dir +1: forwards, -1: backwards).
       1: it can match (or the budget ran out: a context only ever narrows, never decides). */
    static int dx_run(const dx_tab *t, int32_t pc, const uint8_t *p, int64_t n, int64_t pos,
                      int dir) {
        int32_t st_pc[DX_STACK];
        int64_t st_pos[DX_STACK], st_lim[DX_STACK];
        int sp = 0, budget = DX_BUDGET;
        for (;;) {
            if (--budget < 0) return 1;
            int32_t a = t->prog_a[pc];
            switch (t->prog_op[pc]) {
            case DX_ACCEPT:
                return 1;
            case DX_JMP:
                pc = a;
                continue;
            case DX_SPLIT:
                if (sp == DX_STACK) return 1;
                st_pc[sp] = t->prog_b[pc]; st_pos[sp] = pos; st_lim[sp] = pos; sp++;
                pc = a;
                continue;
            case DX_CHAR: {
                int64_t at = dir > 0 ? pos : pos - 1;
                if (at >= 0 && at < n && DX_IN(t, a, p[at])) { pos += dir; pc++; continue; }
                break;
            }
            default: {  /* DX_REP */
                int32_t low = t->prog_b[pc], high = t->prog_c[pc];
                int64_t count = 0, at = dir > 0 ? pos : pos - 1;
                while ((high < 0 || count < high) && at >= 0 && at < n && DX_IN(t, a, p[at])) {
                    count++; at += dir;
                }
                if (count < low) break;
                if (count > low) {
                    if (sp == DX_STACK) return 1;
                    st_pc[sp] = pc + 1; st_pos[sp] = pos + dir * (count - 1);
                    st_lim[sp] = pos + dir * low; sp++;
                }
                pos += dir * count; pc++;
                continue;
            }
            }
            /* this way failed: resume the latest alternative */
            if (sp == 0) return 0;
            pc = st_pc[sp - 1]; pos = st_pos[sp - 1];
            if (pos == st_lim[sp - 1]) sp--; else st_pos[sp - 1] = pos - dir;
        }
    }

    static int dx_context_ok(const dx_tab *t, int32_t k, const uint8_t *p, int64_t n,
                             int64_t start, int32_t len) {
        int32_t c0 = t->lp_ctx[k], c1 = t->lp_ctx[k + 1];
        if (c0 == c1) return 1;
        for (int32_t c = c0; c < c1; c++)
            if (dx_run(t, t->ctx_tail[c], p, n, start + len, 1)
                && dx_run(t, t->ctx_head[c], p, n, start, -1))
                return 1;
        return 0;
    }

    static int dx_cmp_hit(const void *a, const void *b) {
        const dx_hit *x = (const dx_hit *)a, *y = (const dx_hit *)b;
        if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
        return (x->lit > y->lit) - (x->lit < y->lit);
    }

    static int dx_cmp_cand(const void *a, const void *b) {
        const dx_cand *x = (const dx_cand *)a, *y = (const dx_cand *)b;
        if (x->line != y->line) return x->line < y->line ? -1 : 1;
        return (x->pat > y->pat) - (x->pat < y->pat);
    }

    static int64_t dx_count_newlines(const uint8_t *p, int64_t len) {
        int64_t c = 0;
        for (int64_t j = 0; j < len; j++) c += (p[j] == '\\n');
        return c;
    }

    /* literal hits whose window starts in [lo, hi), appended to hits */
    static int dx_find_literals(const dx_tab *t, const uint8_t *p, int64_t n, int64_t lo,
                                int64_t hi, dx_hits *hits) {
        if (t->win[0].bitmap && dx_scan_windows(t, &t->win[0], p, n, lo, hi, hits)) return -1;
        if (t->win[1].bitmap && dx_scan_windows(t, &t->win[1], p, n, lo, hi, hits)) return -1;
        if (t->nteddy) {
    #ifdef DX_TEDDY
            if (dx_simd) {
                if (dx_scan_teddy(t, p, n, lo, hi, hits)) return -1;
            } else
    #endif
            if (dx_scan_teddy_portable(t, p, n, lo, hi, hits)) return -1;
        }
        if (t->ntiny && dx_scan_tiny(t, p, n, lo, hi, hits)) return -1;
        return 0;
    }

    /* Where the line of a position is; moves from the last answer, so nearby is cheap. */
    typedef struct { int64_t line, begin, end, counted, line_at_counted, cur; } dx_lines;

    static void dx_line_of(dx_lines *s, const uint8_t *p, int64_t n, const int64_t *starts,
                           int64_t nlines, int64_t pos) {
        if (starts) {
            int64_t k = s->cur;
            while (k > 0 && starts[k] > pos) k--;
            while (k + 1 < nlines && starts[k + 1] <= pos) k++;
            s->cur = k; s->line = k; s->begin = starts[k]; s->end = starts[k + 1] - 1;
            return;
        }
        if (s->end >= 0 && pos >= s->begin && pos <= s->end) return;
        if (pos >= s->counted)
            s->line_at_counted += dx_count_newlines(p + s->counted, pos - s->counted);
        else
            s->line_at_counted -= dx_count_newlines(p + pos, s->counted - pos);
        s->counted = pos;
        s->line = s->line_at_counted;
        int64_t begin = pos;
        while (begin > 0 && p[begin - 1] != '\\n') begin--;
        const uint8_t *nl = (const uint8_t *)memchr(p + pos, '\\n', (size_t)(n - pos));
        s->begin = begin;
        s->end = nl ? (int64_t)(nl - p) : n;
    }

    #define DX_BLOCK 65536  /* scanned by every pass while it is in the cache */

    /* Candidates (line, its bounds, pattern), sorted and unique, for the buffer p[0:n].
       starts == NULL: lines are split on '\\n'. Else line k spans [starts[k], starts[k+1] - 1)
       of a joined buffer (nlines + 1 entries). Returns 0, or -1 when out of memory. */
    static int dx_scan(const dx_tab *t, const uint8_t *p, int64_t n, const int64_t *starts,
                       int64_t nlines, dx_cands *out) {
        dx_hits hits = {NULL, 0, 0};
        dx_lines where = {0, 0, -1, 0, 0, 0};
        int64_t *last_line = (int64_t *)malloc(sizeof(int64_t) * (size_t)(t->npat + 1));
        int rc = -1;
        if (!last_line) goto done;
        for (int32_t k = 0; k < t->npat; k++) last_line[k] = -1;
        for (int64_t lo = 0; lo < n; lo += DX_BLOCK) {
            int64_t hi = lo + DX_BLOCK < n ? lo + DX_BLOCK : n;
            hits.n = 0;
            if (dx_find_literals(t, p, n, lo, hi, &hits)) goto done;
            if (hits.n == 0) continue;
            qsort(hits.v, hits.n, sizeof(dx_hit), dx_cmp_hit);
            for (size_t h = 0; h < hits.n; h++) {
                int64_t pos = hits.v[h].pos;
                int32_t lit = hits.v[h].lit;
                dx_line_of(&where, p, n, starts, nlines, pos);
                for (int32_t k = t->lp_start[lit]; k < t->lp_start[lit + 1]; k++) {
                    int32_t pat = t->lp_pat[k];
                    if (last_line[pat] == where.line) continue;
                    if (!dx_context_ok(t, k, p, n, pos, t->litlen[lit])) continue;
                    last_line[pat] = where.line;
                    if (dx_push_cand(out, where.line, where.begin, where.end, pat)) goto done;
                }
            }
        }
        if (out->n > 1) {  /* sort; a literal holding a newline may repeat a pair: drop those */
            qsort(out->v, out->n, sizeof(dx_cand), dx_cmp_cand);
            size_t kept = 1;
            for (size_t k = 1; k < out->n; k++)
                if (out->v[k].line != out->v[kept - 1].line || out->v[k].pat != out->v[kept - 1].pat)
                    out->v[kept++] = out->v[k];
            out->n = kept;
        }
        rc = 0;
    done:
        free(hits.v);
        free(last_line);
        return rc;
    }
    """
    ctypedef struct dx_win:
        uint32_t bits
        uint32_t kbits
        uint32_t stride
        uint8_t *bitmap
        uint32_t *kkey
        int32_t *kstart
        int32_t *kcount
        int32_t *ent_lit
        int32_t *ent_off

    ctypedef struct dx_tab:
        dx_win win[2]
        int32_t nlit
        uint8_t *litdata
        int64_t *litpos
        int32_t *litlen
        uint8_t *licase
        int32_t *lp_start
        int32_t *lp_pat
        int32_t ntiny
        int32_t *tiny_lit
        uint8_t tiny_first[256]
        int32_t nteddy
        uint8_t teddy_mask[6][16]
        int32_t teddy_start[9]
        int32_t teddy_lit[48]
        int32_t npat
        int32_t *lp_ctx
        int32_t *ctx_head
        int32_t *ctx_tail
        uint8_t *prog_op
        int32_t *prog_a
        int32_t *prog_b
        int32_t *prog_c
        uint8_t *sets

    ctypedef struct dx_cand:
        int64_t line
        int64_t begin
        int64_t end
        int32_t pat

    ctypedef struct dx_cands:
        dx_cand *v
        size_t n
        size_t cap

    enum: DX_TEDDY_MAX
    void dx_init()
    void dx_key_insert(dx_win *t, uint32_t w, int32_t start, int32_t count)
    int dx_scan(const dx_tab *t, const uint8_t *p, int64_t n, const int64_t *starts,
                int64_t nlines, dx_cands *out) nogil

dx_init()

# How often a byte appears in ordinary training output (rough log-frequency, 0..10); a
# literal's prefilter window is the one whose bytes are rarest by this measure.
cdef dict _BYTE_COMMONNESS = {}
for _c in range(256):
    _BYTE_COMMONNESS[_c] = 1
for _chars, _weight in (
    (b" ", 10), (b"etaoinsr0123456789", 8), (b"lcdhumpf.:/-,=", 6), (b"gwybv_[]|\"'", 4),
    (b"kxjqz()%{}+", 3), (b"ABCDEFGHIJKLMNOPQRSTUVWXYZ\t<>#*@!?;~$&^`\\", 2),
):
    for _c in _chars:
        _BYTE_COMMONNESS[_c] = _weight


# Words on most lines of training output: a window inside one of them passes the filter often.
_COMMON_TOKENS = (
    b"loss rank size nccl number grad norm step iteration learning rate epoch batch time elapsed "
    b"info debug warning error samples tokens throughput consumed default cuda device memory "
    b"node host process worker model layer weight torch python site-packages local float tensor "
    b"train eval checkpoint saving loading file line data skipped the and for with from"
).split()


_COMMON_WINDOWS = frozenset(t[i : i + 4] for t in _COMMON_TOKENS for i in range(len(t) - 3))


def _window_cost(window: bytes, ignorecase: bool) -> int:
    lowered = window.lower()
    cost = sum([_BYTE_COMMONNESS[c] for c in (lowered if ignorecase else window)])
    return cost + 40 if lowered in _COMMON_WINDOWS else cost


def _case_variants(window: bytes) -> list[bytes]:
    """Every spelling of a lowercase window that ASCII case-insensitive matching accepts."""
    variants = [b""]
    for c in window:
        options = (c, c - 32) if 97 <= c <= 122 else (c,)
        variants = [v + bytes((o,)) for v in variants for o in options]
    return variants


def _choose_offset(literal: bytes, ignorecase: bool, used: dict, span: int) -> int:
    """Where the `span` registered windows of `literal` start: the rarest stretch of it."""
    best_offset, best_cost = 0, None
    costs = [
        _window_cost(literal[o : o + 4], ignorecase) * 4 + used.get(literal[o : o + 4], 0)
        for o in range(len(literal) - 3)
    ]
    for offset in range(len(costs) - (span - 1)):
        cost = sum(costs[offset : offset + span])
        if best_cost is None or cost < best_cost:
            best_offset, best_cost = offset, cost
    return best_offset


STRIDE = 4  # the long-literal pass looks at every 4th position
LONG = STRIDE + 3  # literals this long always hold a window starting at a multiple of STRIDE


cdef void _free_win(dx_win *win) noexcept:
    free(win.bitmap)
    free(win.kkey)
    free(win.kstart)
    free(win.kcount)
    free(win.ent_lit)
    free(win.ent_off)
    win.bitmap = NULL
    win.kkey = NULL
    win.kstart = NULL
    win.kcount = NULL
    win.ent_lit = NULL
    win.ent_off = NULL


cdef _build_windows(dx_win *win, dict windows, uint32_t stride):
    cdef Py_ssize_t nkeys = len(windows), nent = sum(map(len, windows.values()))
    cdef uint32_t bits = 16, kbits = 4
    while (1 << bits) < nkeys * 256 and bits < 22:
        bits += 1
    while (1 << kbits) < nkeys * 2:
        kbits += 1
    win.stride = stride
    win.bits = bits
    win.kbits = kbits
    win.bitmap = <uint8_t *>calloc((1 << bits) // 8, 1)
    win.kkey = <uint32_t *>calloc(1 << kbits, sizeof(uint32_t))
    win.kstart = <int32_t *>calloc(1 << kbits, sizeof(int32_t))
    win.kcount = <int32_t *>calloc(1 << kbits, sizeof(int32_t))
    win.ent_lit = <int32_t *>malloc(sizeof(int32_t) * (nent + 1))
    win.ent_off = <int32_t *>malloc(sizeof(int32_t) * (nent + 1))
    if not (win.bitmap and win.kkey and win.kstart and win.kcount and win.ent_lit
            and win.ent_off):
        _free_win(win)
        raise MemoryError()
    cdef int32_t e = 0, start
    cdef uint32_t w
    for window, entries in windows.items():
        start = e
        for lit, offset in entries:
            win.ent_lit[e] = lit
            win.ent_off[e] = offset
            e += 1
        w = int.from_bytes(window, "little")
        dx_key_insert(win, w, start, e - start)


cdef class Matcher:
    """Matches a fixed list of catalog patterns ('(?i)' prefix = ASCII case-insensitive)."""

    cdef dx_tab t
    cdef readonly list patterns
    cdef readonly object plan
    cdef list _search
    cdef list _always

    def __cinit__(self):
        memset(&self.t, 0, sizeof(dx_tab))

    def __init__(self, patterns, plan=None):
        """`plan`: the MatcherPlan of these very patterns (kept by a caller from an earlier
        `self.plan`), or None to compute it."""
        self.patterns = list(patterns)
        self._search = [LineSearch(p).search for p in self.patterns]
        if plan is None:
            plan = matcher_plan(self.patterns, LONG)
        self.plan = plan
        self._always = list(plan.always)
        self._build(list(plan.literals), plan.literal_patterns)
        self._build_program(plan.program, plan.literal_patterns)

    cdef _build(self, list literals, list literal_patterns):
        cdef dx_tab *t = &self.t
        cdef Py_ssize_t k, j, nlit = len(literals)
        cdef bytes data = b"".join(lit for lit, _ in literals)
        t.npat = len(self.patterns)
        t.nlit = nlit
        t.litdata = <uint8_t *>malloc(len(data) + 1)
        t.litpos = <int64_t *>malloc(sizeof(int64_t) * (nlit + 1))
        t.litlen = <int32_t *>malloc(sizeof(int32_t) * (nlit + 1))
        t.licase = <uint8_t *>malloc(nlit + 1)
        t.lp_start = <int32_t *>malloc(sizeof(int32_t) * (nlit + 1))
        t.lp_pat = <int32_t *>malloc(sizeof(int32_t) * (sum(map(len, literal_patterns)) + 1))
        t.tiny_lit = <int32_t *>malloc(sizeof(int32_t) * (nlit + 1))
        if not (t.litdata and t.litpos and t.litlen and t.licase and t.lp_start and t.lp_pat
                and t.tiny_lit):
            raise MemoryError()
        memcpy(t.litdata, PyBytes_AS_STRING(data), len(data))
        long_windows = {}  # 4-byte window -> [(literal id, offset)]
        short_windows = {}
        short = []  # 3-6 bytes
        used = {}
        cdef int64_t pos = 0
        cdef int32_t npairs = 0
        for k in range(nlit):
            literal, ignorecase = literals[k]
            t.litpos[k] = pos
            t.litlen[k] = len(literal)
            t.licase[k] = 1 if ignorecase else 0
            pos += len(literal)
            t.lp_start[k] = npairs
            for j in sorted(literal_patterns[k]):
                t.lp_pat[npairs] = j
                npairs += 1
            if len(literal) <= 2:
                t.tiny_lit[t.ntiny] = k
                t.ntiny += 1
                for first in _case_variants(literal[:1]) if ignorecase else (literal[:1],):
                    t.tiny_first[first[0]] = 1
            elif len(literal) < LONG:
                short.append(k)
                spellings = (_case_variants(literal) if ignorecase else [literal])
                if len(literal) == 3:  # every 4th byte: the window still starts at the literal
                    spellings = [v + bytes((x,)) for v in spellings for x in range(256)]
                else:
                    offset = _choose_offset(literal, ignorecase, used, 1)
                    spellings = [v[offset : offset + 4] for v in spellings]
                for spelling in spellings:
                    short_windows.setdefault(spelling, []).append((k, 0 if len(literal) == 3
                                                                   else offset))
            else:
                offset = _choose_offset(literal, ignorecase, used, STRIDE)
                for o in range(offset, offset + STRIDE):
                    window = literal[o : o + 4]
                    used[window] = used.get(window, 0) + 1
                    for spelling in _case_variants(window) if ignorecase else [window]:
                        long_windows.setdefault(spelling, []).append((k, o))
        t.lp_start[nlit] = npairs
        if long_windows:
            _build_windows(&t.win[0], long_windows, STRIDE)
        if len(short) > DX_TEDDY_MAX:
            _build_windows(&t.win[1], short_windows, 1)
        elif short:
            self._build_teddy(short, literals)

    cdef _build_teddy(self, list short, list literals):
        """Spread the 3-6 byte literals over 8 buckets; mark their first 3 bytes' nibbles."""
        cdef dx_tab *t = &self.t
        cdef int b, j, k, c
        buckets = [[] for _ in range(8)]
        for k, lit in enumerate(short):
            buckets[k % 8].append(lit)
        k = 0
        for b in range(8):
            t.teddy_start[b] = k
            for lit in buckets[b]:
                t.teddy_lit[k] = lit
                k += 1
                literal, ignorecase = literals[lit]
                for j in range(3):
                    byte = literal[j : j + 1]
                    for spelling in _case_variants(byte) if ignorecase else [byte]:
                        c = spelling[0]
                        t.teddy_mask[2 * j][c & 15] |= 1 << b
                        t.teddy_mask[2 * j + 1][c >> 4] |= 1 << b
        t.teddy_start[8] = k
        t.nteddy = k

    cdef _build_program(self, program, list literal_patterns):
        cdef dx_tab *t = &self.t
        cdef Py_ssize_t k, ncode = len(program.code), nsets = len(program.sets)
        cdef list contexts = [
            ctx for by_pattern in literal_patterns for j in sorted(by_pattern)
            for ctx in by_pattern[j]
        ]
        cdef Py_ssize_t npairs = sum(map(len, literal_patterns))
        t.lp_ctx = <int32_t *>malloc(sizeof(int32_t) * (npairs + 1))
        t.ctx_head = <int32_t *>malloc(sizeof(int32_t) * (len(contexts) + 1))
        t.ctx_tail = <int32_t *>malloc(sizeof(int32_t) * (len(contexts) + 1))
        t.prog_op = <uint8_t *>malloc(ncode + 1)
        t.prog_a = <int32_t *>malloc(sizeof(int32_t) * (ncode + 1))
        t.prog_b = <int32_t *>malloc(sizeof(int32_t) * (ncode + 1))
        t.prog_c = <int32_t *>malloc(sizeof(int32_t) * (ncode + 1))
        t.sets = <uint8_t *>calloc(nsets * 32 + 1, 1)
        if not (t.lp_ctx and t.ctx_head and t.ctx_tail and t.prog_op and t.prog_a and t.prog_b
                and t.prog_c and t.sets):
            raise MemoryError()
        for k, (op, a, b, c) in enumerate(program.code):
            t.prog_op[k] = op
            t.prog_a[k] = a
            t.prog_b[k] = b
            t.prog_c[k] = c
        for k, members in enumerate(program.sets):
            for c in members:
                t.sets[k * 32 + (c >> 3)] |= 1 << (c & 7)
        cdef int32_t pair = 0, used = 0
        for by_pattern in literal_patterns:
            for j in sorted(by_pattern):
                t.lp_ctx[pair] = used
                for head, tail in by_pattern[j]:
                    t.ctx_head[used] = head
                    t.ctx_tail[used] = tail
                    used += 1
                pair += 1
        t.lp_ctx[pair] = used

    def __dealloc__(self):
        _free_win(&self.t.win[0])
        _free_win(&self.t.win[1])
        free(self.t.litdata)
        free(self.t.litpos)
        free(self.t.litlen)
        free(self.t.licase)
        free(self.t.lp_start)
        free(self.t.lp_pat)
        free(self.t.tiny_lit)
        free(self.t.lp_ctx)
        free(self.t.ctx_head)
        free(self.t.ctx_tail)
        free(self.t.prog_op)
        free(self.t.prog_a)
        free(self.t.prog_b)
        free(self.t.prog_c)
        free(self.t.sets)

    cdef list _candidates(self, bytes buf, int64_t *starts, int64_t nlines):
        """(line, begin, end, pattern) for every literal hit: the GIL is released meanwhile."""
        cdef dx_cands out
        cdef int rc
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(buf)
        cdef int64_t n = PyBytes_GET_SIZE(buf)
        cdef size_t k
        out.v = NULL
        out.n = 0
        out.cap = 0
        with nogil:
            rc = dx_scan(&self.t, p, n, starts, nlines, &out)
        try:
            if rc != 0:
                raise MemoryError()
            return [(out.v[k].line, out.v[k].begin, out.v[k].end, out.v[k].pat)
                    for k in range(out.n)]
        finally:
            free(out.v)

    def scan(self, buf):
        """Every (line_index, pattern_index) match in `buf`, lines split on b'\\n'."""
        if not isinstance(buf, bytes):
            buf = bytes(buf)
        if not self.patterns:
            return []
        cdef bytes data = buf
        cdef list pairs = []
        cdef list search = self._search
        cdef int64_t current = -1
        cdef bytes line = b""
        for line_index, begin, end, pattern_index in self._candidates(data, NULL, 0):
            if line_index != current:
                current = line_index
                line = data[begin:end]
            if search[pattern_index](line):
                pairs.append((line_index, pattern_index))
        if self._always:
            pairs = self._with_always(pairs, data.split(b"\n"))
        return pairs

    def scan_lines(self, lines):
        """Every (line_index, pattern_index) match over the given lines, in line order."""
        lines = list(lines)
        if not lines or not self.patterns:
            return []
        cdef bytes joined = b"\n".join(lines)
        cdef Py_ssize_t k, nlines = len(lines)
        cdef int64_t *starts = <int64_t *>malloc(sizeof(int64_t) * (nlines + 1))
        cdef int64_t offset = 0
        if starts == NULL:
            raise MemoryError()
        try:
            for k in range(nlines):
                starts[k] = offset
                offset += len(lines[k]) + 1
            starts[nlines] = offset
            candidates = self._candidates(joined, starts, nlines)
        finally:
            free(starts)
        cdef list search = self._search
        cdef list pairs = [
            (line_index, pattern_index)
            for line_index, _, _, pattern_index in candidates
            if search[pattern_index](lines[line_index])
        ]
        if self._always:
            pairs = self._with_always(pairs, lines)
        return pairs

    cdef list _with_always(self, list pairs, list lines):
        """Add the patterns without a literal, tried on every line (slow; not in the catalog)."""
        cdef list search = self._search
        found = set(pairs)
        for line_index, line in enumerate(lines):
            for pattern_index in self._always:
                if search[pattern_index](line):
                    found.add((line_index, pattern_index))
        return sorted(found)
