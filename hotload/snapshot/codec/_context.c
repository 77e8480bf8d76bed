/* Native kernels of the `context` codec (docs/snapshot-format.md, "Context payload").
 *
 * One chunk of a tensor: the decoder holds the previous words, computes each element's
 * context class from its previous bits, and reads from one LSB-first bitstream, per class,
 * Golomb-coded gaps (class elements skipped before the next change) and, at each change,
 * its sign and magnitude. hotload/snapshot/codec/context_reference.py is the same
 * algorithm in Python (the specification in code, and the fallback when this module is
 * not built); tests check that both produce the same bytes and the same errors.
 *
 * Every read is bounds-checked: a hostile stream ends in ValueError, never in a read or
 * write outside the buffers it was given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CLASSES 8
#define MAX_KEY_BITS 12
#define UNIT_MAGNITUDES 255
#define MAX_VALUE_K 62

typedef struct {
    int width;
    int shift;
    int key_bits;
    int lo;
    int classes;
    uint64_t golomb[MAX_CLASSES];
    int value_k[MAX_CLASSES];
    uint8_t table[1 << MAX_KEY_BITS];
} Params;

static PyObject *
fail(const char *message)
{
    PyErr_SetString(PyExc_ValueError, message);
    return NULL;
}

/* ---- bit reader (LSB first) ------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    uint64_t buf;
    int nbits;
} Reader;

/* Called with fewer than 32 bits held. Bits above nbits stay zero (read_unary relies on
 * it). With 8 bytes left, one unaligned load takes as many whole bytes as fit. */
static inline void
refill(Reader *r)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (r->end - r->p >= 8) {
        uint64_t word;
        memcpy(&word, r->p, 8);
        int take = (63 - r->nbits) >> 3;
        r->buf |= (word << r->nbits) & ((((uint64_t)1 << (8 * take)) - 1) << r->nbits);
        r->p += take;
        r->nbits += 8 * take;
        return;
    }
#endif
    while (r->nbits <= 56 && r->p < r->end) {
        r->buf |= (uint64_t)(*r->p++) << r->nbits;
        r->nbits += 8;
    }
}

/* n <= 32 bits; returns -1 when the stream ends first. */
static inline int
read_bits(Reader *r, int n, uint64_t *out)
{
    if (n == 0) {
        *out = 0;
        return 0;
    }
    if (r->nbits < n) {
        refill(r);
        if (r->nbits < n)
            return -1;
    }
    *out = r->buf & ((n == 64) ? ~(uint64_t)0 : (((uint64_t)1 << n) - 1));
    r->buf >>= n;
    r->nbits -= n;
    return 0;
}

/* Zeros before the next one bit (which is consumed); -1 past the end or over limit. */
static inline int
read_unary(Reader *r, uint64_t limit, uint64_t *out)
{
    uint64_t count = 0;
    for (;;) {
        if (r->nbits == 0 || r->buf == 0) {
            count += (uint64_t)r->nbits;
            r->buf = 0;
            r->nbits = 0;
            if (count > limit)
                return -1;
            refill(r);
            if (r->nbits == 0)
                return -1;
            continue;
        }
        int zeros = __builtin_ctzll(r->buf);
        if (zeros >= r->nbits) { /* cannot happen: bits above nbits are zero */
            return -1;
        }
        count += (uint64_t)zeros;
        if (count > limit)
            return -1;
        r->buf >>= zeros + 1;
        r->nbits -= zeros + 1;
        *out = count;
        return 0;
    }
}

/* A class's Golomb code in one chunk: its parameter and what follows from it, computed
 * once per chunk (a division per gap read was a measurable share of the decode). */
typedef struct {
    uint64_t m;
    uint64_t limit;  /* the largest value allowed (the chunk's length) */
    uint64_t qlimit; /* limit / m + 1: the longest unary quotient read */
    uint64_t cut;    /* truncated binary: (1 << b) - m */
    uint64_t magic;  /* 2**64 / m + 1 (1 < m < 2**32): value / m as one multiply */
    int b;           /* ceil(log2 m) */
    int floor_log;   /* floor(log2 m) */
} Golomb;

static inline void
golomb_init(Golomb *g, uint64_t m, uint64_t limit)
{
    g->m = m;
    g->limit = limit;
    g->qlimit = limit / m + 1;
    g->b = m == 1 ? 0 : 64 - __builtin_clzll(m - 1);
    g->cut = m == 1 ? 0 : ((uint64_t)1 << g->b) - m;
    g->magic = m > 1 && m <= 0xFFFFFFFFu ? UINT64_MAX / m + 1 : 0;
    g->floor_log = 63 - __builtin_clzll(m);
}

/* value / m for value < 2**32 (a chunk's gaps): Lemire's multiply for 32-bit dividends
 * where the compiler has 128-bit products, a division otherwise. */
static inline uint64_t
golomb_quotient(const Golomb *g, uint64_t value)
{
#ifdef __SIZEOF_INT128__
    if (g->magic && value <= 0xFFFFFFFFu)
        return (uint64_t)(((unsigned __int128)g->magic * value) >> 64);
#endif
    return value / g->m;
}

static inline int
read_golomb(Reader *r, const Golomb *g, uint64_t *out)
{
    uint64_t q, low;
    if (read_unary(r, g->qlimit, &q) < 0)
        return -1;
    if (g->m == 1) {
        *out = q;
    } else {
        if (read_bits(r, g->b - 1, &low) < 0)
            return -1;
        if (low >= g->cut) {
            uint64_t extra;
            if (read_bits(r, 1, &extra) < 0)
                return -1;
            low = ((low << 1) | extra) - g->cut;
        }
        *out = q * g->m + low;
    }
    return *out > g->limit ? -1 : 0;
}

/* Exp-Golomb of order k (value >= 0), at most 64 value bits. */
static inline int
read_exp_golomb(Reader *r, int k, uint64_t *out)
{
    uint64_t zeros, high = 0, lowbits = 0;
    if (read_unary(r, 63, &zeros) < 0)
        return -1;
    int n = (int)zeros + k;
    if (n > 63)
        return -1;
    if (n > 32) {
        if (read_bits(r, 32, &lowbits) < 0 || read_bits(r, n - 32, &high) < 0)
            return -1;
        lowbits |= high << 32;
    } else if (read_bits(r, n, &lowbits) < 0) {
        return -1;
    }
    *out = (((uint64_t)1 << n) | lowbits) - ((uint64_t)1 << k);
    return 0;
}

/* ---- bit writer ------------------------------------------------------------------
 *
 * LSB first, like the reader. Its buffer is allocated once, for a bound on the stream's
 * size (write_stream), so a put checks nothing: it adds its bits to a 64-bit word and, on
 * a little-endian CPU, stores the whole word with one unaligned 8-byte write, keeping only
 * the bits of the last partial byte (no branch on how full the word is: a flush every few
 * puts was a mispredicted branch each time). The bound leaves 8 bytes of room past the
 * last byte, so the store never passes the allocation. */

#if defined(__GNUC__) || defined(__clang__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

typedef struct {
    uint8_t *data;
    Py_ssize_t size; /* whole bytes written */
    uint64_t buf;    /* the next bits, nbits < 8 of them between puts */
    int nbits;
} Writer;

/* n <= 56 bits of value (no bit above them set) */
INLINE void
put_bits(Writer *w, uint64_t value, int n)
{
    w->buf |= value << w->nbits;
    w->nbits += n;
    int bytes = w->nbits >> 3;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(w->data + w->size, &w->buf, 8);
#else
    for (int i = 0; i < bytes; i++)
        w->data[w->size + i] = (uint8_t)(w->buf >> (8 * i));
#endif
    w->size += bytes;
    w->buf = bytes ? w->buf >> (8 * bytes) : w->buf; /* bytes <= 7: nbits <= 63 */
    w->nbits &= 7;
}

INLINE void
put_unary(Writer *w, uint64_t zeros)
{
    for (; zeros >= 56; zeros -= 56)
        put_bits(w, 0, 56);
    put_bits(w, (uint64_t)1 << zeros, (int)zeros + 1);
}

/* A Golomb code with the class's parameters (golomb_init): the quotient in unary, the
 * remainder in truncated binary (its b-1 high bits first when it takes b bits). */
INLINE void
put_golomb(Writer *w, uint64_t value, const Golomb *g)
{
    if (g->m == 1) {
        put_unary(w, value);
        return;
    }
    uint64_t q = golomb_quotient(g, value), low = value - q * g->m;
    put_unary(w, q);
    if (low < g->cut) {
        put_bits(w, low, g->b - 1);
        return;
    }
    low += g->cut;
    put_bits(w, (low >> 1) | ((low & 1) << (g->b - 1)), g->b);
}

/* Bits of the Golomb code of value: at most this many (the quotient bounded by a shift
 * by floor(log2 m) instead of a division). */
static inline uint64_t
golomb_bound(uint64_t value, const Golomb *g)
{
    return (value >> g->floor_log) + 1 + (uint64_t)g->b;
}

INLINE void
put_exp_golomb(Writer *w, uint64_t value, int k)
{
    uint64_t shifted = value + ((uint64_t)1 << k);
    int n = 63 - __builtin_clzll(shifted); /* floor(log2) */
    put_unary(w, (uint64_t)(n - k));
    uint64_t low = shifted - ((uint64_t)1 << n);
    if (n > 32) {
        put_bits(w, low & 0xFFFFFFFFu, 32);
        put_bits(w, low >> 32, n - 32);
        return;
    }
    put_bits(w, low, n);
}

static inline void
writer_finish(Writer *w)
{
    if (w->nbits > 0)
        w->data[w->size++] = (uint8_t)(w->buf & 0xFF);
    w->buf = 0;
    w->nbits = 0;
}

/* ---- parameters ------------------------------------------------------------------ */

static int
parse_params(Params *p, int width, int shift, int key_bits, int lo, Py_buffer *golomb,
             Py_buffer *value_k)
{
    if (width != 1 && width != 2 && width != 4 && width != 8)
        return -1;
    if (key_bits < 0 || key_bits > MAX_KEY_BITS || shift < 0 || shift + key_bits > 8 * width)
        return -1;
    if (golomb->len % 8 != 0)
        return -1;
    int classes = (int)(golomb->len / 8);
    if (classes < 1 || classes > MAX_CLASSES || value_k->len != classes)
        return -1;
    if (lo < 0 || lo > (1 << key_bits))
        return -1;
    p->width = width;
    p->shift = shift;
    p->key_bits = key_bits;
    p->lo = lo;
    p->classes = classes;
    const uint8_t *g = golomb->buf;
    const uint8_t *v = value_k->buf;
    for (int c = 0; c < classes; c++) {
        uint64_t m = 0;
        for (int i = 7; i >= 0; i--)
            m = (m << 8) | g[8 * c + i];
        if (m < 1 || m > ((uint64_t)1 << 32))
            return -1;
        p->golomb[c] = m;
        if (v[c] != UNIT_MAGNITUDES && v[c] > 62)
            return -1;
        p->value_k[c] = v[c];
    }
    for (int key = 0; key < (1 << key_bits); key++) {
        int c = key - lo + 1;
        p->table[key] = (uint8_t)(c < 0 ? 0 : (c > classes - 1 ? classes - 1 : c));
    }
    return 0;
}

static inline uint64_t
word_at(const uint8_t *base, int width, Py_ssize_t i)
{
    switch (width) {
    case 1:
        return base[i];
    case 2: {
        uint16_t v;
        memcpy(&v, base + 2 * i, 2);
        return v;
    }
    case 4: {
        uint32_t v;
        memcpy(&v, base + 4 * i, 4);
        return v;
    }
    default: {
        uint64_t v;
        memcpy(&v, base + 8 * i, 8);
        return v;
    }
    }
}

static inline void
store_word(uint8_t *base, int width, Py_ssize_t i, uint64_t value)
{
    switch (width) {
    case 1:
        base[i] = (uint8_t)value;
        break;
    case 2: {
        uint16_t v = (uint16_t)value;
        memcpy(base + 2 * i, &v, 2);
        break;
    }
    case 4: {
        uint32_t v = (uint32_t)value;
        memcpy(base + 4 * i, &v, 4);
        break;
    }
    default:
        memcpy(base + 8 * i, &value, 8);
    }
}

/* ---- decode ---------------------------------------------------------------------- */

/* One element that may change: the slow path, also used inside blocks holding a change. */
#define DECODE_ONE(I, C)                                                                  \
    do {                                                                                  \
        int c_ = (C);                                                                     \
        if (left[c_]) {                                                                   \
            left[c_]--;                                                                   \
            break;                                                                        \
        }                                                                                 \
        if (found == changes) {                                                           \
            error = "more changes in the stream than the chunk declares";                 \
            goto done;                                                                    \
        }                                                                                 \
        uint64_t sign, magnitude;                                                         \
        if (read_bits(&r, 1, &sign) < 0) {                                                \
            error = "context stream truncated";                                           \
            goto done;                                                                    \
        }                                                                                 \
        if (p.value_k[c_] == UNIT_MAGNITUDES) {                                           \
            magnitude = 1;                                                                \
        } else {                                                                          \
            if (read_exp_golomb(&r, p.value_k[c_], &magnitude) < 0) {                     \
                error = "context stream has a malformed value";                           \
                goto done;                                                                \
            }                                                                             \
            magnitude += 1;                                                               \
        }                                                                                 \
        if (magnitude > half || (magnitude == half && !sign)) {                           \
            error = "context value out of range for the word width";                      \
            goto done;                                                                    \
        }                                                                                 \
        pos_out[found] = (uint32_t)(I);                                                   \
        store_word(val_out, p.width, found, 2 * magnitude - sign);                        \
        found++;                                                                          \
        if (read_golomb(&r, &codes[c_], &gap) < 0) {                                      \
            error = "context stream has a malformed gap";                                 \
            goto done;                                                                    \
        }                                                                                 \
        left[c_] = gap;                                                                   \
    } while (0)

/* Blocks of BLOCK elements are counted per class in one 64-bit word (8 lanes of 8 bits,
 * through a table from key to 1 << 8c); a block whose counts all stay within the classes'
 * countdowns holds no change and is skipped with eight subtractions. */
#define BLOCK 32
#define LANES 0x8080808080808080ULL
#define DECODE_LOOP(TYPE)                                                                 \
    do {                                                                                  \
        const TYPE *w = (const TYPE *)base;                                               \
        Py_ssize_t i = 0;                                                                 \
        uint64_t limits = 0;                                                              \
        for (int c = 0; c < MAX_CLASSES; c++)                                             \
            limits |= (uint64_t)(left[c] < 127 ? left[c] : 127) << (8 * c);               \
        for (; i + BLOCK <= n; i += BLOCK) {                                              \
            uint64_t acc0 = 0, acc1 = 0;                                                  \
            for (int j = 0; j < BLOCK; j += 2) {                                          \
                acc0 += ones[(w[i + j] >> p.shift) & mask];                               \
                acc1 += ones[(w[i + j + 1] >> p.shift) & mask];                           \
            }                                                                             \
            uint64_t acc = acc0 + acc1;                                                   \
            if ((((limits | LANES) - acc) & LANES) == LANES) {                            \
                for (int c = 0; c < MAX_CLASSES; c++) {                                   \
                    uint64_t k = (acc >> (8 * c)) & 0xFF;                                 \
                    if (k) {                                                              \
                        left[c] -= k;                                                     \
                        limits = (limits & ~((uint64_t)0xFF << (8 * c))) |                \
                                 ((uint64_t)(left[c] < 127 ? left[c] : 127) << (8 * c));  \
                    }                                                                     \
                }                                                                         \
                continue;                                                                 \
            }                                                                             \
            for (int j = 0; j < BLOCK; j++)                                               \
                DECODE_ONE(i + j, p.table[(w[i + j] >> p.shift) & mask]);                 \
            limits = 0;                                                                   \
            for (int c = 0; c < MAX_CLASSES; c++)                                         \
                limits |= (uint64_t)(left[c] < 127 ? left[c] : 127) << (8 * c);           \
        }                                                                                 \
        for (; i < n; i++)                                                                \
            DECODE_ONE(i, p.table[(w[i] >> p.shift) & mask]);                             \
    } while (0)

typedef struct {
    const Params *p;
    const uint8_t *prev;
    Py_ssize_t n;
    Reader r;
    Py_ssize_t changes;
    uint32_t *pos_out;
    uint8_t *val_out;
} Decode;

/* What must hold once a chunk's elements are all decoded (both decode loops). */
static const char *
check_end(const Params *p, const uint64_t *left, Py_ssize_t found, Py_ssize_t changes,
          const Reader *r)
{
    for (int c = 0; c < p->classes; c++)
        if (left[c] != 0)
            return "context gaps do not end at the chunk's end";
    if (found != changes)
        return "fewer changes in the stream than the chunk declares";
    /* only zero padding may follow, inside the last byte */
    if (r->p != r->end || r->nbits >= 8 || r->buf != 0)
        return "context stream longer than its codes";
    return NULL;
}

static const char *
run_decode(Decode *d)
{
    const Params p = *d->p;
    const char *error = NULL;
    uint64_t left[MAX_CLASSES], gap;
    uint64_t mask = ((uint64_t)1 << p.key_bits) - 1;
    uint64_t half = (uint64_t)1 << (8 * p.width - 1);
    Py_ssize_t n = d->n, changes = d->changes, found = 0;
    uint32_t *pos_out = d->pos_out;
    uint8_t *val_out = d->val_out;
    const uint8_t *base = d->prev;
    Reader r = d->r;
    uint64_t ones[1 << MAX_KEY_BITS];
    for (int key = 0; key < (1 << p.key_bits); key++)
        ones[key] = (uint64_t)1 << (8 * p.table[key]);
    Golomb codes[MAX_CLASSES];
    for (int c = 0; c < p.classes; c++)
        golomb_init(&codes[c], p.golomb[c], (uint64_t)n);
    for (int c = 0; c < MAX_CLASSES; c++) {
        left[c] = 0;
        if (c < p.classes) {
            if (read_golomb(&r, &codes[c], &gap) < 0)
                return "context stream has a malformed first gap";
            left[c] = gap;
        }
    }
    switch (p.width) {
    case 1:
        DECODE_LOOP(uint8_t);
        break;
    case 2:
        DECODE_LOOP(uint16_t);
        break;
    case 4:
        DECODE_LOOP(uint32_t);
        break;
    default:
        DECODE_LOOP(uint64_t);
    }
done:
    if (error)
        return error;
    return check_end(&p, left, found, changes, &r);
}

/* ---- decode, AVX2 ----------------------------------------------------------------
 *
 * The same decode in another order of work: every element's class is computed first
 * (16 words per instruction for 2-byte words), then each class's next change is found by
 * counting that class's elements 64 at a time (a compare, a mask, a popcount) instead of
 * one table lookup per element. Changes are still taken in element order (the nearest
 * next change of all classes), so the stream is read in the same order, the same bits,
 * with the same errors at the same places as run_decode: tests run both on every stream.
 * Built for x86-64 with GCC or Clang, used when the CPU has AVX2 and BMI2 (checked once).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SIMD 1
#include <immintrin.h>
#define SIMD_TARGET __attribute__((target("avx2,bmi,bmi2,popcnt")))

SIMD_TARGET static void
classes_of(const Params *p, const uint8_t *base, Py_ssize_t n, uint8_t *cls)
{
    uint64_t mask = ((uint64_t)1 << p->key_bits) - 1;
    Py_ssize_t i = 0;
    if (p->width == 2) {
        const uint16_t *w = (const uint16_t *)base;
        const __m128i shift = _mm_cvtsi32_si128(p->shift);
        const __m256i keys = _mm256_set1_epi16((short)mask);
        const __m256i below = _mm256_set1_epi16((short)(p->lo - 1));
        const __m256i zero = _mm256_setzero_si256();
        const __m256i top = _mm256_set1_epi16((short)(p->classes - 1));
        for (; i + 32 <= n; i += 32) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(w + i));
            __m256i b = _mm256_loadu_si256((const __m256i *)(w + i + 16));
            /* class = clamp(key - lo + 1, 0, classes - 1), as parse_params' table */
            a = _mm256_sub_epi16(_mm256_and_si256(_mm256_srl_epi16(a, shift), keys), below);
            b = _mm256_sub_epi16(_mm256_and_si256(_mm256_srl_epi16(b, shift), keys), below);
            a = _mm256_min_epi16(_mm256_max_epi16(a, zero), top);
            b = _mm256_min_epi16(_mm256_max_epi16(b, zero), top);
            __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
            _mm256_storeu_si256((__m256i *)(cls + i), packed);
        }
    }
    for (; i < n; i++)
        cls[i] = p->table[(word_at(base, p->width, i) >> p->shift) & mask];
}

/* The index of the (skip + 1)-th element of class c at or after i; -1 when there is none,
 * with *rest = skip less the class's elements from i to the end. */
SIMD_TARGET static Py_ssize_t
find_class(const uint8_t *cls, Py_ssize_t i, Py_ssize_t n, int c, uint64_t skip,
           uint64_t *rest)
{
    const __m256i want = _mm256_set1_epi8((char)c);
    for (; i + 64 <= n; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(cls + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(cls + i + 32));
        uint64_t m = (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(a, want)) |
                     (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(b, want))
                         << 32;
        uint64_t k = (uint64_t)_mm_popcnt_u64(m);
        if (k > skip)
            return i + (Py_ssize_t)_tzcnt_u64(_pdep_u64((uint64_t)1 << skip, m));
        skip -= k;
    }
    for (; i < n; i++)
        if (cls[i] == c) {
            if (skip == 0)
                return i;
            skip--;
        }
    *rest = skip;
    return -1;
}

/* next[c] and left[c] after a gap of `skip` class-c elements from i: the next change's
 * index (left 0), or n when the chunk ends first (left: the gap not used up). */
#define LOCATE(C, I, SKIP)                                                                \
    do {                                                                                  \
        uint64_t rest_ = 0;                                                               \
        Py_ssize_t at_;                                                                   \
        if (cls == NULL) { /* one class: every element */                                 \
            uint64_t room_ = (uint64_t)(n - (I));                                         \
            at_ = (SKIP) < room_ ? (I) + (Py_ssize_t)(SKIP) : -1;                         \
            rest_ = (SKIP) < room_ ? 0 : (SKIP) - room_;                                  \
        } else {                                                                          \
            at_ = find_class(cls, (I), n, (C), (SKIP), &rest_);                           \
        }                                                                                 \
        next[C] = at_ < 0 ? n : at_;                                                      \
        left[C] = at_ < 0 ? rest_ : 0;                                                    \
    } while (0)

SIMD_TARGET static const char *
run_decode_simd(Decode *d, const uint8_t *cls)
{
    const Params p = *d->p;
    uint64_t left[MAX_CLASSES], gap;
    Py_ssize_t next[MAX_CLASSES];
    uint64_t half = (uint64_t)1 << (8 * p.width - 1);
    Py_ssize_t n = d->n, changes = d->changes, found = 0;
    uint32_t *pos_out = d->pos_out;
    uint8_t *val_out = d->val_out;
    Reader r = d->r;
    Golomb codes[MAX_CLASSES];
    for (int c = 0; c < p.classes; c++)
        golomb_init(&codes[c], p.golomb[c], (uint64_t)n);
    for (int c = 0; c < p.classes; c++) {
        if (read_golomb(&r, &codes[c], &gap) < 0)
            return "context stream has a malformed first gap";
        LOCATE(c, 0, gap);
    }
    for (int c = p.classes; c < MAX_CLASSES; c++) {
        next[c] = n; /* unused classes never come next: the loop below runs over all 8 */
        left[c] = 0;
    }
    for (;;) {
        int c = 0;
        Py_ssize_t i = next[0];
        for (int k = 1; k < MAX_CLASSES; k++) {
            int nearer = next[k] < i;
            i = nearer ? next[k] : i;
            c = nearer ? k : c;
        }
        if (i >= n)
            break;
        if (found == changes)
            return "more changes in the stream than the chunk declares";
        uint64_t sign, magnitude;
        if (read_bits(&r, 1, &sign) < 0)
            return "context stream truncated";
        if (p.value_k[c] == UNIT_MAGNITUDES) {
            magnitude = 1;
        } else {
            if (read_exp_golomb(&r, p.value_k[c], &magnitude) < 0)
                return "context stream has a malformed value";
            magnitude += 1;
        }
        if (magnitude > half || (magnitude == half && !sign))
            return "context value out of range for the word width";
        pos_out[found] = (uint32_t)i;
        store_word(val_out, p.width, found, 2 * magnitude - sign);
        found++;
        if (read_golomb(&r, &codes[c], &gap) < 0)
            return "context stream has a malformed gap";
        LOCATE(c, i + 1, gap);
    }
    return check_end(&p, left, found, changes, &r);
}
#undef LOCATE
#endif /* HAVE_SIMD */

/* Whether run_decode_simd runs on this CPU (set once, at import). */
static int simd_usable = 0;

#ifdef HAVE_SIMD
/* Each decoding thread's class array, kept between chunks: a fresh allocation of a
 * chunk's size per call was mostly the kernel zeroing new pages. It grows to the largest
 * chunk the thread decodes (1 MiB at the default chunk size, MAX_CHUNK_ELEMENTS bytes at
 * most) and lives as long as the thread. */
static _Thread_local uint8_t *scratch = NULL;
static _Thread_local size_t scratch_size = 0;

static uint8_t *
class_scratch(size_t n)
{
    if (n > scratch_size) {
        uint8_t *grown = realloc(scratch, n);
        if (grown == NULL)
            return NULL;
        scratch = grown;
        scratch_size = n;
    }
    return scratch;
}
#endif

/* The decode, on the fast path where it runs; the class array is the chunk's size. */
static const char *
decode_any(Decode *d, int want_simd)
{
#ifdef HAVE_SIMD
    if (want_simd && simd_usable) {
        uint8_t *cls = NULL;
        if (d->p->classes > 1 && d->n > 0) {
            cls = class_scratch((size_t)d->n);
            if (cls == NULL)
                return run_decode(d);
            classes_of(d->p, d->prev, d->n, cls);
        }
        return run_decode_simd(d, cls);
    }
#endif
    return run_decode(d);
}

static PyObject *
decode_chunk(PyObject *self, PyObject *args)
{
    Py_buffer prev, golomb, value_k, stream, positions, values;
    int width, shift, key_bits, lo;
    Py_ssize_t changes;
    int want_simd = 1;
    if (!PyArg_ParseTuple(args, "y*iiiiy*y*y*nw*w*|p", &prev, &width, &shift, &key_bits, &lo,
                          &golomb, &value_k, &stream, &changes, &positions, &values,
                          &want_simd))
        return NULL;
    const char *error = NULL;
    Params p;
    if (parse_params(&p, width, shift, key_bits, lo, &golomb, &value_k) < 0) {
        error = "context parameters out of range";
    } else {
        Py_ssize_t n = prev.len / width;
        if (prev.len % width || changes < 0 || changes > n || positions.len != 4 * changes ||
            values.len != (Py_ssize_t)width * changes || n > 0xFFFFFFFFLL) {
            error = "context buffers disagree with the chunk";
        } else {
            Decode d = {&p, prev.buf, n,
                        {stream.buf, (const uint8_t *)stream.buf + stream.len, 0, 0},
                        changes, positions.buf, values.buf};
            Py_BEGIN_ALLOW_THREADS
            error = decode_any(&d, want_simd);
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&prev);
    PyBuffer_Release(&golomb);
    PyBuffer_Release(&value_k);
    PyBuffer_Release(&stream);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&values);
    if (error)
        return fail(error);
    Py_RETURN_NONE;
}

/* ---- encode ----------------------------------------------------------------------
 *
 * A chunk's stream needs, for every change, its class and its rank in that class (how
 * many elements of the class precede it), and each class's size: the gaps are rank
 * differences. Three ways to get them, the same numbers: one class when there is no key
 * (the rank is the position, no element is read), a portable scan (each block of 32
 * elements counted per class in one 64-bit word, element by element only in blocks
 * holding a change) and, where the CPU has AVX2, 64 elements' classes at a time and one
 * compare, mask and popcount per class. Tests run all three (and the Python reference)
 * on every stream. */

typedef struct {
    const Params *p;
    const uint8_t *prev;
    Py_ssize_t n;
    const uint32_t *pos;
    Py_ssize_t changes;
    uint64_t *rank;    /* out: each change's rank in its class */
    uint8_t *cls;      /* out: each change's class */
    uint64_t *size;    /* out: each class's elements (MAX_CLASSES) */
} Ranks;

static void
ranks_one_class(Ranks *k)
{
    /* no key: every element has the class of key 0 */
    int c = k->p->table[0];
    for (int j = 0; j < MAX_CLASSES; j++)
        k->size[j] = 0;
    k->size[c] = (uint64_t)k->n;
    for (Py_ssize_t t = 0; t < k->changes; t++) {
        k->rank[t] = k->pos[t];
        k->cls[t] = (uint8_t)c;
    }
}

/* Lanes of `acc` (8 bits per class) added to the counts. */
static inline void
add_lanes(uint64_t *count, uint64_t acc)
{
    for (int c = 0; c < MAX_CLASSES; c++)
        count[c] += (acc >> (8 * c)) & 0xFF;
}

/* Element I, previous word WORD, counted in its class; a change there takes its rank. */
#define RANK_ONE(I, WORD)                                                                 \
    do {                                                                                  \
        int c_ = p->table[((WORD) >> p->shift) & mask];                                   \
        if (t < changes && k->pos[t] == (uint32_t)(I)) {                                  \
            k->rank[t] = count[c_];                                                       \
            k->cls[t] = (uint8_t)c_;                                                      \
            t++;                                                                          \
        }                                                                                 \
        count[c_]++;                                                                      \
    } while (0)

#define RANKS_LOOP(TYPE)                                                                  \
    do {                                                                                  \
        const TYPE *w = (const TYPE *)k->prev;                                            \
        Py_ssize_t i = 0, t = 0;                                                          \
        uint64_t acc = 0;                                                                 \
        int held = 0; /* blocks in acc: at most 7 (7 * 32 < 256 per lane) */              \
        for (; i + BLOCK <= n; i += BLOCK) {                                              \
            if (t < changes && k->pos[t] < (uint32_t)(i + BLOCK)) {                       \
                add_lanes(count, acc);                                                    \
                acc = 0;                                                                  \
                held = 0;                                                                 \
                for (int j = 0; j < BLOCK; j++)                                           \
                    RANK_ONE(i + j, w[i + j]);                                            \
                continue;                                                                 \
            }                                                                             \
            uint64_t acc0 = 0, acc1 = 0;                                                  \
            for (int j = 0; j < BLOCK; j += 2) {                                          \
                acc0 += ones[(w[i + j] >> p->shift) & mask];                              \
                acc1 += ones[(w[i + j + 1] >> p->shift) & mask];                          \
            }                                                                             \
            acc += acc0 + acc1;                                                           \
            if (++held == 7) {                                                            \
                add_lanes(count, acc);                                                    \
                acc = 0;                                                                  \
                held = 0;                                                                 \
            }                                                                             \
        }                                                                                 \
        add_lanes(count, acc);                                                            \
        for (; i < n; i++)                                                                \
            RANK_ONE(i, w[i]);                                                            \
    } while (0)

static void
ranks_portable(Ranks *k)
{
    const Params *p = k->p;
    uint64_t mask = ((uint64_t)1 << p->key_bits) - 1;
    Py_ssize_t n = k->n, changes = k->changes;
    uint64_t count[MAX_CLASSES] = {0};
    uint64_t ones[1 << MAX_KEY_BITS];
    for (int key = 0; key < (1 << p->key_bits); key++)
        ones[key] = (uint64_t)1 << (8 * p->table[key]);
    switch (p->width) {
    case 1:
        RANKS_LOOP(uint8_t);
        break;
    case 2:
        RANKS_LOOP(uint16_t);
        break;
    case 4:
        RANKS_LOOP(uint32_t);
        break;
    default:
        RANKS_LOOP(uint64_t);
    }
    for (int c = 0; c < MAX_CLASSES; c++)
        k->size[c] = count[c];
}
#undef RANKS_LOOP

#ifdef HAVE_SIMD
/* 2-byte words only: the classes of 64 elements from four 16-word loads (as classes_of),
 * then per class a 64-bit mask of its elements; a change's rank is its class's count
 * before the block plus the mask's bits below it. */
SIMD_TARGET static void
ranks_simd(Ranks *k)
{
    const Params *p = k->p;
    const uint16_t *w = (const uint16_t *)k->prev;
    uint64_t mask = ((uint64_t)1 << p->key_bits) - 1;
    Py_ssize_t n = k->n, changes = k->changes, i = 0, t = 0;
    int classes = p->classes;
    uint64_t count[MAX_CLASSES] = {0};
    const __m128i shift = _mm_cvtsi32_si128(p->shift);
    const __m256i keys = _mm256_set1_epi16((short)mask);
    const __m256i below = _mm256_set1_epi16((short)(p->lo - 1));
    const __m256i zero = _mm256_setzero_si256();
    const __m256i top = _mm256_set1_epi16((short)(classes - 1));
    for (; i + 64 <= n; i += 64) {
        __m256i v[4];
        for (int j = 0; j < 4; j++) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(w + i + 16 * j));
            a = _mm256_sub_epi16(_mm256_and_si256(_mm256_srl_epi16(a, shift), keys), below);
            v[j] = _mm256_min_epi16(_mm256_max_epi16(a, zero), top);
        }
        __m256i lo32 = _mm256_permute4x64_epi64(_mm256_packus_epi16(v[0], v[1]), 0xD8);
        __m256i hi32 = _mm256_permute4x64_epi64(_mm256_packus_epi16(v[2], v[3]), 0xD8);
        uint64_t m[MAX_CLASSES];
        for (int c = 0; c < classes; c++) {
            const __m256i want = _mm256_set1_epi8((char)c);
            m[c] = (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo32, want)) |
                   (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi32, want))
                       << 32;
        }
        while (t < changes && k->pos[t] < (uint32_t)(i + 64)) {
            Py_ssize_t j = (Py_ssize_t)k->pos[t] - i;
            int c = p->table[(w[i + j] >> p->shift) & mask];
            k->rank[t] = count[c] + (uint64_t)_mm_popcnt_u64(_bzhi_u64(m[c], (unsigned)j));
            k->cls[t] = (uint8_t)c;
            t++;
        }
        for (int c = 0; c < classes; c++)
            count[c] += (uint64_t)_mm_popcnt_u64(m[c]);
    }
    for (; i < n; i++)
        RANK_ONE(i, w[i]);
    for (int c = 0; c < MAX_CLASSES; c++)
        k->size[c] = count[c];
}
#endif
#undef RANK_ONE

static void
ranks_any(Ranks *k, int want_simd)
{
    if (k->p->key_bits == 0) {
        ranks_one_class(k);
        return;
    }
#ifdef HAVE_SIMD
    if (want_simd && simd_usable && k->p->width == 2) {
        ranks_simd(k);
        return;
    }
#endif
    ranks_portable(k);
}

/* One change's bits: its sign, its magnitude (none for a unit class) and the gap to its
 * class's next change. The codes are assembled in a register and written with one put
 * when they fit in 56 bits (nearly always), so the writer's state is updated once per
 * change, not once per field; the same bits as the puts field by field. */
INLINE void
put_change(Writer *w, uint64_t sign, uint64_t magnitude, int k, uint64_t gap, const Golomb *g)
{
    uint64_t code = sign;
    int len = 1;
    if (k != UNIT_MAGNITUDES) {
        uint64_t shifted = magnitude - 1 + ((uint64_t)1 << k);
        int n = 63 - __builtin_clzll(shifted), zeros = n - k;
        if (len + 2 * n - k + 1 <= 56) {
            code |= (((uint64_t)1 << zeros) | ((shifted - ((uint64_t)1 << n)) << (zeros + 1)))
                    << len;
            len += 2 * n - k + 1;
        } else {
            put_bits(w, code, len);
            put_exp_golomb(w, magnitude - 1, k);
            code = 0;
            len = 0;
        }
    }
    uint64_t q = gap, rest = 0;
    int rest_len = 0;
    if (g->m != 1) {
        q = golomb_quotient(g, gap);
        uint64_t low = gap - q * g->m;
        if (low < g->cut) {
            rest = low;
            rest_len = g->b - 1;
        } else {
            low += g->cut;
            rest = (low >> 1) | ((low & 1) << (g->b - 1));
            rest_len = g->b;
        }
    }
    if (q + 1 + (uint64_t)rest_len + (uint64_t)len <= 56) {
        code |= (((uint64_t)1 << q) | (rest << (q + 1))) << len;
        put_bits(w, code, len + (int)q + 1 + rest_len);
        return;
    }
    put_bits(w, code, len);
    put_unary(w, q);
    put_bits(w, rest, rest_len);
}

/* The bits, from the ranks: each class's first gap, then per change its sign, its
 * magnitude and the gap to its class's next change (or to the chunk's end), into w->data,
 * allocated here (the raw allocator: no GIL is held). 0, or 2 for a zero difference, 3 for
 * a unit-magnitude class's larger change, -1 out of memory. */
static int
write_stream(Writer *out, const Params *p, const uint8_t *values, Py_ssize_t changes,
             uint64_t *rank, const uint8_t *cls, const uint64_t *size)
{
    /* the writer's state in locals: stores through its byte pointer could alias a
     * caller's struct, and every put would wait on reloading it */
    Writer local = *out, *w = &local;
    uint64_t next[MAX_CLASSES];
    Golomb codes[MAX_CLASSES];
    for (int c = 0; c < MAX_CLASSES; c++)
        next[c] = size[c];
    for (int c = 0; c < p->classes; c++)
        golomb_init(&codes[c], p->golomb[c], 0);
    /* backwards: rank[t] becomes the gap after change t in its class; the stream's bits
     * are bounded on the way (sign, magnitude at most 1 + 2 * 63 bits, Golomb bound) */
    uint64_t bits = 64;
    for (Py_ssize_t t = changes - 1; t >= 0; t--) {
        int c = cls[t];
        uint64_t r = rank[t];
        rank[t] = next[c] - r - 1;
        next[c] = r;
        bits += 1 + (p->value_k[c] == UNIT_MAGNITUDES ? 0 : 127) + golomb_bound(rank[t], &codes[c]);
    }
    for (int c = 0; c < p->classes; c++)
        bits += golomb_bound(next[c], &codes[c]);
    w->data = PyMem_RawMalloc((size_t)(bits / 8 + 16));
    out->data = w->data;
    if (w->data == NULL)
        return -1;
    for (int c = 0; c < p->classes; c++)
        put_golomb(w, next[c], &codes[c]);
    for (Py_ssize_t t = 0; t < changes; t++) {
        int c = cls[t];
        uint64_t v = word_at(values, p->width, t);
        if (v == 0)
            return 2;
        uint64_t sign = v & 1, magnitude = (v >> 1) + sign;
        if (p->value_k[c] == UNIT_MAGNITUDES && magnitude != 1)
            return 3;
        put_change(w, sign, magnitude, p->value_k[c], rank[t], &codes[c]);
    }
    writer_finish(w);
    *out = local;
    return 0;
}

static PyObject *
encode_chunk(PyObject *self, PyObject *args)
{
    Py_buffer prev, golomb, value_k, positions, values;
    int width, shift, key_bits, lo;
    int want_simd = 1;
    if (!PyArg_ParseTuple(args, "y*iiiiy*y*y*y*|p", &prev, &width, &shift, &key_bits, &lo,
                          &golomb, &value_k, &positions, &values, &want_simd))
        return NULL;
    const char *error = NULL;
    PyObject *result = NULL;
    Params p;
    Writer w = {NULL, 0, 0, 0};
    uint64_t *rank = NULL;
    uint8_t *change_class = NULL;
    uint64_t size[MAX_CLASSES];
    if (parse_params(&p, width, shift, key_bits, lo, &golomb, &value_k) < 0) {
        error = "context parameters out of range";
        goto done;
    }
    Py_ssize_t n = prev.len / width;
    Py_ssize_t changes = positions.len / 4;
    if (prev.len % width || positions.len % 4 || values.len != (Py_ssize_t)width * changes ||
        n > 0xFFFFFFFFLL) {
        error = "context buffers disagree with the chunk";
        goto done;
    }
    const uint32_t *pos = positions.buf;
    for (Py_ssize_t t = 0; t < changes; t++)
        if (pos[t] >= n || (t && pos[t] <= pos[t - 1])) {
            error = "positions must be increasing and inside the chunk";
            goto done;
        }
    rank = PyMem_Malloc(sizeof(uint64_t) * (size_t)(changes + 1));
    change_class = PyMem_Malloc((size_t)(changes + 1));
    if (rank == NULL || change_class == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    Ranks k = {&p, prev.buf, n, pos, changes, rank, change_class, size};
    ranks_any(&k, want_simd);
    failed = write_stream(&w, &p, values.buf, changes, rank, change_class, size);
    Py_END_ALLOW_THREADS
    if (failed == 2)
        error = "a change has a zero difference";
    else if (failed == 3)
        error = "a class with unit magnitudes has a larger change";
    else if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (!error)
        result = PyBytes_FromStringAndSize((const char *)w.data, w.size);
done:
    PyMem_RawFree(w.data);
    PyMem_Free(rank);
    PyMem_Free(change_class);
    PyBuffer_Release(&prev);
    PyBuffer_Release(&golomb);
    PyBuffer_Release(&value_k);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&values);
    if (error)
        return fail(error);
    return result;
}

/* ---- the model's magnitude orders ---------------------------------------------------
 *
 * context_model.value_orders for every class at once: per class whose magnitudes are not
 * all 1, the Exp-Golomb order 0..top with the fewest bits (the lowest on a tie), top the
 * bit length of the class's largest magnitude - 1 (at most 62). The Python reference
 * measures a code's length with floor(log2(float(v) + 2**k)); for v + 2**k below 2**41
 * that is the integer bit length exactly (a correctly rounded log2, or one a few ulp off,
 * cannot cross an integer there), so this returns None and leaves larger magnitudes to
 * the reference. */
#define ORDERS_EXACT ((uint64_t)1 << 40)

/* The orders are found in two passes over the changes (magnitude m, class c): orders_see
 * learns which classes are coded (a magnitude above 1), each class's largest m - 1 and
 * whether it has a zero magnitude (m - 1 wraps, as the reference's uint64 does: never
 * exact); orders_add counts each coded class's m - 1, the small ones in a table (their
 * lengths are summed once per distinct value), the others into the costs at once. The
 * costs are integer sums, so the order of the additions changes nothing. */
#define ORDERS_SMALL 64

typedef struct {
    int classes;
    int coded[MAX_CLASSES], zero[MAX_CLASSES], top[MAX_CLASSES];
    uint64_t largest[MAX_CLASSES];
    uint64_t small[MAX_CLASSES][ORDERS_SMALL]; /* [0]: the magnitudes of 1 */
    uint64_t cost[MAX_CLASSES][MAX_VALUE_K + 1];
} Orders;

static void
orders_init(Orders *o, int classes)
{
    memset(o, 0, sizeof *o);
    o->classes = classes;
}

INLINE void
orders_see(Orders *o, uint64_t m, int c)
{
    if (m > 1) {
        o->coded[c] = 1;
        o->largest[c] = m - 1 > o->largest[c] ? m - 1 : o->largest[c];
    } else if (m == 0) {
        o->zero[c] = 1;
    }
}

/* 0, or 1 when a coded class has a magnitude too large (or zero) for exact lengths. */
static int
orders_tops(Orders *o)
{
    for (int c = 0; c < o->classes; c++) {
        if (o->coded[c] && (o->zero[c] || o->largest[c] >= ORDERS_EXACT))
            return 1;
        int bits = o->largest[c] ? 64 - __builtin_clzll(o->largest[c]) : 0;
        o->top[c] = bits < MAX_VALUE_K ? bits : MAX_VALUE_K;
    }
    return 0;
}

/* Bits of the Exp-Golomb code of order k of value (value + 2^k below 2^63: exact). */
INLINE uint64_t
exp_golomb_bits(uint64_t value, int k)
{
    return (uint64_t)(2 * (63 - __builtin_clzll(value + ((uint64_t)1 << k))) - k + 1);
}

INLINE void
orders_add(Orders *o, uint64_t m, int c)
{
    if (!o->coded[c])
        return;
    uint64_t above = m - 1;
    if (above < ORDERS_SMALL) {
        o->small[c][above]++;
        return;
    }
    for (int k = 0; k <= o->top[c]; k++)
        o->cost[c][k] += exp_golomb_bits(above, k);
}

static void
orders_finish(Orders *o, uint8_t *orders)
{
    for (int c = 0; c < o->classes; c++) {
        orders[c] = UNIT_MAGNITUDES;
        if (!o->coded[c])
            continue;
        int best = 0;
        for (int k = 0; k <= o->top[c]; k++) {
            for (uint64_t v = 0; v < ORDERS_SMALL; v++)
                if (o->small[c][v])
                    o->cost[c][k] += o->small[c][v] * exp_golomb_bits(v, k);
            if (o->cost[c][k] < o->cost[c][best])
                best = k;
        }
        orders[c] = (uint8_t)best;
    }
}

/* Each class's order into orders[classes]: 0, 1 when a magnitude is too large for exact
 * integer lengths, -1 for a class outside 0..classes-1. */
static int
orders_of(const uint64_t *m, const int64_t *cls, Py_ssize_t n, int classes, uint8_t *orders)
{
    Orders o;
    orders_init(&o, classes);
    for (Py_ssize_t t = 0; t < n; t++) {
        if (cls[t] < 0 || cls[t] >= classes)
            return -1;
        orders_see(&o, m[t], (int)cls[t]);
    }
    if (orders_tops(&o))
        return 1;
    for (Py_ssize_t t = 0; t < n; t++)
        orders_add(&o, m[t], (int)cls[t]);
    orders_finish(&o, orders);
    return 0;
}

static PyObject *
value_orders(PyObject *self, PyObject *args)
{
    Py_buffer magnitudes, change_class;
    int classes;
    if (!PyArg_ParseTuple(args, "y*y*i", &magnitudes, &change_class, &classes))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = magnitudes.len / 8;
    if (magnitudes.len % 8 || change_class.len != 8 * n || classes < 1 ||
        classes > MAX_CLASSES) {
        fail("value_orders: magnitudes and classes disagree");
        goto done;
    }
    uint8_t orders[MAX_CLASSES];
    int found;
    Py_BEGIN_ALLOW_THREADS
    found = orders_of(magnitudes.buf, change_class.buf, n, classes, orders);
    Py_END_ALLOW_THREADS
    if (found < 0)
        fail("value_orders: a class outside 0..classes-1");
    else if (found > 0)
        result = Py_NewRef(Py_None);
    else
        result = PyBytes_FromStringAndSize((const char *)orders, classes);
done:
    PyBuffer_Release(&magnitudes);
    PyBuffer_Release(&change_class);
    return result;
}
#undef ORDERS_EXACT

/* ---- the model's class window ------------------------------------------------------
 *
 * context_model.choose_model's arithmetic around its two log2 calls, which stay numpy's
 * (numpy's float64 log2 is SVML's on AVX-512 machines, libm's elsewhere: the model must
 * come out as the Python fit chose it on each). Every other float operation is the same
 * IEEE operation in the same order as numpy's elementwise calls and its sequential cumsum
 * (setup.py builds with -ffp-contract=off, so no multiply-add is fused), so the costs, the
 * window and the model are the ones the Python fit finds, bit for bit.
 *
 * model_prepare(per_key, changed, classes): for each candidate lo (first..first+count-1)
 * the coded entropy's terms n*h(k/n) are wanted for every key, for the keys below lo and
 * for the keys above lo + classes - 2: their k and n (size + 2*count of each), and the
 * arguments of log2. Returns (first, count, bytes of p, a, b, n as float64 rows).
 * model_finish(rows, logs, per_key, changed, first, count, classes): logs = log2 of rows a
 * and b; the cost of every lo, the first minimum (the first NaN, as np.argmin), and each
 * class's elements and changes at that lo. */

static int
model_counts(Py_buffer *per_key, Py_buffer *changed, int classes, Py_ssize_t *size,
             int *clamped)
{
    Py_ssize_t n = per_key->len / 8;
    if (per_key->len % 8 || changed->len != per_key->len || n < 1 || n > (1 << MAX_KEY_BITS) ||
        (n & (n - 1)) || classes < 2 || classes > MAX_CLASSES)
        return -1;
    *size = n;
    *clamped = classes < n + 2 ? classes : (int)(n + 2);
    return 0;
}

/* model_prepare's work for size keys' counts (nk: elements, ck: changes) and k classes:
 * (first, count, rows), or NULL with an exception set. */
static PyObject *
prepare_rows(const int64_t *nk, const int64_t *ck, Py_ssize_t size, int k)
{
    Py_ssize_t first = -1, last = -1;
    for (Py_ssize_t i = 0; i < size; i++)
        if (ck[i]) {
            if (first < 0)
                first = i;
            last = i;
        }
    if (first < 0)
        return fail("model_prepare: no key has a change");
    Py_ssize_t lo0 = first > 0 ? first - 1 : 0;
    Py_ssize_t hi = last - k + 4 > first ? last - k + 4 : first;
    hi = hi < size ? hi : size;
    Py_ssize_t count = hi - lo0 + 1, m = size + 2 * count;
    PyObject *rows = PyBytes_FromStringAndSize(NULL, 4 * m * (Py_ssize_t)sizeof(double));
    if (rows == NULL)
        return NULL;
    double *p = (double *)PyBytes_AS_STRING(rows), *a = p + m, *b = a + m, *nn = b + m;
    int64_t c_total = 0, n_total = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        c_total += ck[i];
        n_total += nk[i];
    }
    /* k and n of every term: each key, the keys below lo, the keys from lo + k - 2 up */
    int64_t c_before = 0, n_before = 0;
    Py_ssize_t key = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        p[i] = (double)ck[i];
        nn[i] = (double)nk[i];
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_ssize_t lo = lo0 + j, top = lo + k - 2 < size ? lo + k - 2 : size;
        for (; key < lo; key++) {
            c_before += ck[key];
            n_before += nk[key];
        }
        p[size + j] = (double)c_before;
        nn[size + j] = (double)n_before;
        int64_t c_top = 0, n_top = 0;
        for (Py_ssize_t i = 0; i < top; i++) {
            c_top += ck[i];
            n_top += nk[i];
        }
        p[size + count + j] = (double)(c_total - c_top);
        nn[size + count + j] = (double)(n_total - n_top);
    }
    for (Py_ssize_t i = 0; i < m; i++) {
        double kk = p[i], n = nn[i];
        double q = n > 0 ? kk / (n > 1 ? n : 1) : 0.0;
        p[i] = q;
        a[i] = q > 0 ? q : 1.0;
        b[i] = q < 1 ? 1 - q : 1.0;
    }
    return Py_BuildValue("nnN", lo0, count, rows);
}

static PyObject *
model_prepare(PyObject *self, PyObject *args)
{
    Py_buffer per_key, changed;
    int classes;
    if (!PyArg_ParseTuple(args, "y*y*i", &per_key, &changed, &classes))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t size;
    int k;
    if (model_counts(&per_key, &changed, classes, &size, &k) < 0)
        fail("model_prepare: counts and classes disagree");
    else
        result = prepare_rows(per_key.buf, changed.buf, size, k);
    PyBuffer_Release(&per_key);
    PyBuffer_Release(&changed);
    return result;
}

/* model_finish's work: the window's lo and its k classes' elements and changes, from the
 * rows model_prepare made and the log2 of their rows a and b; -1 out of memory. */
static int
finish_window(const double *p, const double *la, Py_ssize_t m, const int64_t *nk,
              const int64_t *ck, Py_ssize_t size, Py_ssize_t first, Py_ssize_t count, int k,
              Py_ssize_t *lo_out, long long *elements, long long *changes)
{
    const double *nn = p + 3 * m, *lb = la + m;
    double *bits = PyMem_RawMalloc(sizeof(double) * (size_t)(m + size + 1));
    if (bits == NULL)
        return -1;
    double *h = bits + m;
    for (Py_ssize_t i = 0; i < m; i++) {
        double t1 = p[i] * la[i];
        double t2 = 1 - p[i];
        double t3 = t2 * lb[i];
        double hh = -(t1 + t3);
        bits[i] = nn[i] * hh;
    }
    h[0] = 0.0;
    for (Py_ssize_t i = 0; i < size; i++)
        h[i + 1] = i ? h[i] + bits[i] : bits[0];
    Py_ssize_t best = 0;
    double best_cost = 0;
    for (Py_ssize_t j = 0; j < count; j++) {
        Py_ssize_t lo = first + j, top = lo + k - 2 < size ? lo + k - 2 : size;
        double cost = bits[size + j] + (h[top] - h[lo]) + bits[size + count + j];
        if (cost != cost) { /* NaN: np.argmin stops at the first */
            best = j;
            break;
        }
        if (j == 0 || cost < best_cost) {
            best = j;
            best_cost = cost;
        }
    }
    PyMem_RawFree(bits);
    Py_ssize_t lo = first + best;
    for (int j = 0; j < k; j++)
        elements[j] = changes[j] = 0;
    for (Py_ssize_t key = 0; key < size; key++) {
        Py_ssize_t c = key - lo + 1;
        c = c < 0 ? 0 : (c > k - 1 ? k - 1 : c);
        elements[c] += nk[key];
        changes[c] += ck[key];
    }
    *lo_out = lo;
    return 0;
}

/* A tuple of k ints: signed_items' if not NULL, else unsigned_items'; NULL with an
 * exception set. */
static PyObject *
tuple_of_longs(const long long *signed_items, const uint64_t *unsigned_items, int k)
{
    PyObject *tuple = PyTuple_New(k);
    for (int j = 0; tuple != NULL && j < k; j++) {
        PyObject *item = signed_items != NULL ? PyLong_FromLongLong(signed_items[j])
                                              : PyLong_FromUnsignedLongLong(unsigned_items[j]);
        if (item == NULL)
            Py_CLEAR(tuple); /* and the items set before */
        else
            PyTuple_SET_ITEM(tuple, j, item);
    }
    return tuple;
}

/* Whether rows and logs have the sizes model_prepare gave them for these counts. */
static int
window_fits(Py_buffer *rows, Py_buffer *logs, Py_ssize_t size, Py_ssize_t first,
            Py_ssize_t count)
{
    return count >= 1 && first >= 0 && first + count - 1 <= size &&
           rows->len == 4 * (size + 2 * count) * (Py_ssize_t)sizeof(double) &&
           logs->len == 2 * (size + 2 * count) * (Py_ssize_t)sizeof(double);
}

static PyObject *
model_finish(PyObject *self, PyObject *args)
{
    Py_buffer rows, logs, per_key, changed;
    Py_ssize_t first, count;
    int classes;
    if (!PyArg_ParseTuple(args, "y*y*y*y*nni", &rows, &logs, &per_key, &changed, &first, &count,
                          &classes))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t size, lo;
    int k;
    long long elements[MAX_CLASSES], changes[MAX_CLASSES];
    if (model_counts(&per_key, &changed, classes, &size, &k) < 0 ||
        !window_fits(&rows, &logs, size, first, count)) {
        fail("model_finish: rows, logs and counts disagree");
        goto done;
    }
    if (finish_window(rows.buf, logs.buf, size + 2 * count, per_key.buf, changed.buf, size,
                      first, count, k, &lo, elements, changes) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *e = tuple_of_longs(elements, NULL, k), *c = tuple_of_longs(changes, NULL, k);
    if (e == NULL || c == NULL) {
        Py_XDECREF(e);
        Py_XDECREF(c);
        goto done;
    }
    result = Py_BuildValue("nNN", lo, e, c);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&logs);
    PyBuffer_Release(&per_key);
    PyBuffer_Release(&changed);
    return result;
}

/* ---- a model fitted from a tensor's changes ------------------------------------------
 *
 * context.encode_changes fits each candidate model from what the scan found per chunk:
 * its changes' zigzag differences and previous keys (scan_chunk's keys_out).
 * context_model.choose_model takes arrays numpy makes of them (each change's class and
 * magnitude; each key's changes) and fits in a few dozen calls; these two do the same
 * arithmetic in two calls around numpy's log2, making no array in between:
 *
 * fit_prepare(keys, per_key, classes) -> (changed, first, count, rows): each key's changes
 *   (int64 bytes) counted from the chunks' keys (a sequence of u16 buffers), and
 *   model_prepare of them.
 * fit_finish(values, width, keys, elements, window) -> (lo, golomb, value_k) | None: the
 *   model of the chunks' changes (values: a sequence of buffers of zigzag differences);
 *   keys and window None for one class without a key, else the chunks' keys and (rows,
 *   logs, per_key, changed, first, count, classes), logs numpy's log2 of rows a and b.
 *   Golomb parameters as golomb_parameter computes them (the same libm log and log1p as
 *   Python's math module), orders as value_orders; None where value_orders gives None (a
 *   magnitude too large for exact integer lengths). */
#define MAX_GOLOMB ((uint64_t)1 << 32)

typedef struct {
    Py_buffer *parts;
    Py_ssize_t count, items;
} Buffers;

static void
buffers_release(Buffers *b)
{
    for (Py_ssize_t i = 0; i < b->count; i++)
        PyBuffer_Release(&b->parts[i]);
    PyMem_Free(b->parts);
    b->parts = NULL;
    b->count = b->items = 0;
}

/* Every buffer of a sequence, whose lengths must be multiples of item bytes; -1 with an
 * exception set. */
static int
buffers_get(Buffers *b, PyObject *sequence, int item)
{
    b->parts = NULL;
    b->count = b->items = 0;
    PyObject *items = PySequence_Fast(sequence, "fit: a sequence of buffers is needed");
    if (items == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items);
    b->parts = PyMem_Calloc((size_t)count + 1, sizeof(Py_buffer));
    if (b->parts == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(items, i), &b->parts[i],
                               PyBUF_SIMPLE) < 0)
            break;
        b->count = i + 1;
        b->items += b->parts[i].len / item;
        if (b->parts[i].len % item) {
            fail("fit: a buffer's length is not a whole number of items");
            break;
        }
    }
    Py_DECREF(items);
    if (b->count == count && !PyErr_Occurred())
        return 0;
    buffers_release(b);
    return -1;
}

/* Whether every key lies below size; each key's changes counted into ck (size entries)
 * when ck is not NULL. Called with the GIL; releases it for the pass over the keys. */
static int
keys_inside(const Buffers *keys, Py_ssize_t size, int64_t *ck)
{
    int inside = 1;
    Py_BEGIN_ALLOW_THREADS
    if (ck != NULL)
        memset(ck, 0, sizeof(int64_t) * (size_t)size);
    for (Py_ssize_t i = 0; inside && i < keys->count; i++) {
        const uint16_t *k = keys->parts[i].buf;
        for (Py_ssize_t t = 0; t < keys->parts[i].len / 2; t++) {
            if (k[t] >= size) {
                inside = 0;
                break;
            }
            if (ck != NULL)
                ck[k[t]]++;
        }
    }
    Py_END_ALLOW_THREADS
    return inside;
}

static PyObject *
fit_prepare(PyObject *self, PyObject *args)
{
    Py_buffer per_key;
    int classes;
    PyObject *key_parts, *result = NULL, *changed = NULL;
    Buffers keys = {0};
    if (!PyArg_ParseTuple(args, "Oy*i", &key_parts, &per_key, &classes))
        return NULL;
    if (buffers_get(&keys, key_parts, 2) < 0)
        goto done;
    Py_ssize_t size = per_key.len / 8;
    if (per_key.len % 8 || size < 1 || size > (1 << MAX_KEY_BITS) || (size & (size - 1)) ||
        classes < 2 || classes > MAX_CLASSES) {
        fail("fit_prepare: keys, counts and classes disagree");
        goto done;
    }
    changed = PyBytes_FromStringAndSize(NULL, 8 * size);
    if (changed == NULL)
        goto done;
    if (!keys_inside(&keys, size, (int64_t *)PyBytes_AS_STRING(changed))) {
        fail("fit_prepare: keys, counts and classes disagree");
        goto done;
    }
    int k = classes < size + 2 ? classes : (int)(size + 2);
    const int64_t *ck = (const int64_t *)PyBytes_AS_STRING(changed);
    PyObject *window = prepare_rows(per_key.buf, ck, size, k);
    if (window != NULL) {
        result = PyTuple_Pack(4, changed, PyTuple_GET_ITEM(window, 0),
                              PyTuple_GET_ITEM(window, 1), PyTuple_GET_ITEM(window, 2));
        Py_DECREF(window);
    }
done:
    Py_XDECREF(changed);
    buffers_release(&keys);
    PyBuffer_Release(&per_key);
    return result;
}

/* context_model.golomb_parameter, the same float operations on the same libm. */
static uint64_t
golomb_fit(long long changes, long long elements)
{
    if (elements <= 0)
        return 1;
    if (changes <= 0)
        return (uint64_t)elements < MAX_GOLOMB ? (uint64_t)elements : MAX_GOLOMB;
    double p = (double)changes / (double)(elements + 1);
    if (p > 0.999999)
        p = 0.999999;
    double m = ceil(log(2 - p) / -log1p(-p));
    if (!(m < (double)MAX_GOLOMB))
        return MAX_GOLOMB;
    return m < 1 ? 1 : (uint64_t)m;
}

static PyObject *
fit_finish(PyObject *self, PyObject *args)
{
    Py_buffer window_buffers[4] = {{0}};
    int have_window = 0, width;
    long long elements_total;
    PyObject *value_parts, *key_parts, *window, *result = NULL;
    Buffers values = {0}, keys = {0};
    if (!PyArg_ParseTuple(args, "OiOLO", &value_parts, &width, &key_parts, &elements_total,
                          &window))
        return NULL;
    if (width != 1 && width != 2 && width != 4 && width != 8) {
        fail("fit_finish: words out of range");
        goto done;
    }
    if (buffers_get(&values, value_parts, width) < 0)
        goto done;
    long long elements[MAX_CLASSES], changes[MAX_CLASSES];
    Py_ssize_t lo = 0;
    int k = 1;
    uint8_t table[1 << MAX_KEY_BITS];
    if (window == Py_None) {
        elements[0] = elements_total;
        changes[0] = values.items;
    } else {
        Py_ssize_t first, count, size;
        int classes;
        Py_buffer *rows = &window_buffers[0], *logs = &window_buffers[1];
        Py_buffer *per_key = &window_buffers[2], *changed = &window_buffers[3];
        if (!PyTuple_Check(window)) {
            fail("fit_finish: the window is a tuple or None");
            goto done;
        }
        if (!PyArg_ParseTuple(window, "y*y*y*y*nni", rows, logs, per_key, changed, &first,
                              &count, &classes))
            goto done;
        have_window = 1;
        if (buffers_get(&keys, key_parts, 2) < 0)
            goto done;
        int agree = model_counts(per_key, changed, classes, &size, &k) == 0 &&
                    window_fits(rows, logs, size, first, count) && keys.count == values.count;
        for (Py_ssize_t i = 0; agree && i < keys.count; i++)
            agree = keys.parts[i].len / 2 == values.parts[i].len / width;
        if (!agree || !keys_inside(&keys, size, NULL)) {
            fail("fit_finish: keys, values, rows, logs and counts disagree");
            goto done;
        }
        if (finish_window(rows->buf, logs->buf, size + 2 * count, per_key->buf, changed->buf,
                          size, first, count, k, &lo, elements, changes) < 0) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t key = 0; key < size; key++) {
            Py_ssize_t c = key - lo + 1;
            table[key] = (uint8_t)(c < 0 ? 0 : (c > k - 1 ? k - 1 : c));
        }
    }
    uint8_t orders[MAX_CLASSES];
    int found;
    Orders *o = PyMem_Malloc(sizeof(Orders));
    if (o == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    orders_init(o, k);
    Py_BEGIN_ALLOW_THREADS
#define EACH_CHANGE(DO)                                                                   \
    for (Py_ssize_t i = 0; i < values.count; i++) {                                       \
        const uint8_t *v = values.parts[i].buf;                                           \
        const uint16_t *key = have_window ? keys.parts[i].buf : NULL;                     \
        for (Py_ssize_t j = 0; j < values.parts[i].len / width; j++) {                    \
            uint64_t z = word_at(v, width, j);                                            \
            DO(o, (z >> 1) + (z & 1), key ? table[key[j]] : 0);                           \
        }                                                                                 \
    }
    EACH_CHANGE(orders_see);
    found = orders_tops(o);
    if (!found) {
        EACH_CHANGE(orders_add);
        orders_finish(o, orders);
    }
#undef EACH_CHANGE
    Py_END_ALLOW_THREADS
    PyMem_Free(o);
    if (found) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    uint64_t parameters[MAX_CLASSES];
    long long order_of[MAX_CLASSES];
    for (int c = 0; c < k; c++) {
        parameters[c] = golomb_fit(changes[c], elements[c]);
        order_of[c] = orders[c];
    }
    PyObject *golomb = tuple_of_longs(NULL, parameters, k);
    PyObject *value_k = tuple_of_longs(order_of, NULL, k);
    if (golomb == NULL || value_k == NULL) {
        Py_XDECREF(golomb);
        Py_XDECREF(value_k);
        goto done;
    }
    result = Py_BuildValue("nNN", lo, golomb, value_k);
done:
    buffers_release(&values);
    buffers_release(&keys);
    if (have_window)
        for (int i = 0; i < 4; i++)
            PyBuffer_Release(&window_buffers[i]);
    return result;
}
#undef MAX_GOLOMB

/* ---- the order-0 streams' lengths ---------------------------------------------------
 *
 * stream_lengths(positions, values, lengths, width, golomb, value_k) -> (bytes, ...) |
 * None: the length of the stream encode_chunk writes for each chunk with one class and no
 * key (the model golomb, value_k), from the chunks' changes (positions: u32 buffers in
 * the chunk, increasing; values: their zigzag differences; lengths: u64, each chunk's
 * elements) without writing it: per change a sign bit, the magnitude's Exp-Golomb code
 * (none for a unit class) and the Golomb code of the gap to the next change (the last to
 * the chunk's end), after the first change's position. The encoder compares the order-0
 * payload's length with the context one's and writes the order-0 streams only when they
 * win. None where encode_chunk would refuse a change (a zero difference, a unit class's
 * larger change): the caller writes the streams and gets its error. */

/* Bits of value's Golomb code (put_golomb's). */
static inline uint64_t
golomb_bits(uint64_t value, const Golomb *g)
{
    if (g->m == 1)
        return value + 1;
    uint64_t q = golomb_quotient(g, value), low = value - q * g->m;
    return q + 1 + (uint64_t)(low < g->cut ? g->b - 1 : g->b);
}

/* One chunk's stream bits into *bits: 0, 1 where encode_chunk would refuse a change. */
static int
order0_bits(const uint32_t *pos, const uint8_t *values, Py_ssize_t changes, int width,
            uint64_t length, const Golomb *g, int k, uint64_t *bits)
{
    uint64_t total = golomb_bits(pos[0], g);
    for (Py_ssize_t t = 0; t < changes; t++) {
        uint64_t v = word_at(values, width, t), sign = v & 1, magnitude = (v >> 1) + sign;
        if (v == 0 || (k == UNIT_MAGNITUDES && magnitude != 1))
            return 1;
        uint64_t next = t + 1 < changes ? pos[t + 1] : length;
        total += 1 + golomb_bits(next - pos[t] - 1, g);
        if (k != UNIT_MAGNITUDES)
            total += exp_golomb_bits(magnitude - 1, k);
    }
    *bits = total;
    return 0;
}

static PyObject *
stream_lengths(PyObject *self, PyObject *args)
{
    PyObject *position_parts, *value_parts, *result = NULL;
    Py_buffer lengths;
    int width, k;
    unsigned long long m;
    Buffers positions = {0}, values = {0};
    uint64_t *bits = NULL;
    if (!PyArg_ParseTuple(args, "OOy*iKi", &position_parts, &value_parts, &lengths, &width, &m,
                          &k))
        return NULL;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || m < 1 ||
        m > ((uint64_t)1 << 32) || (k > MAX_VALUE_K && k != UNIT_MAGNITUDES) || k < 0) {
        fail("stream_lengths: parameters out of range");
        goto done;
    }
    if (buffers_get(&positions, position_parts, 4) < 0 ||
        buffers_get(&values, value_parts, width) < 0)
        goto done;
    Py_ssize_t chunks = positions.count;
    const uint64_t *length = lengths.buf;
    int agree = values.count == chunks && lengths.len == 8 * chunks;
    for (Py_ssize_t i = 0; agree && i < chunks; i++) {
        Py_ssize_t changes = positions.parts[i].len / 4;
        const uint32_t *pos = positions.parts[i].buf;
        agree = changes > 0 && values.parts[i].len == (Py_ssize_t)width * changes &&
                length[i] <= 0xFFFFFFFFu;
        for (Py_ssize_t t = 0; agree && t < changes; t++)
            agree = pos[t] < length[i] && (t == 0 || pos[t] > pos[t - 1]);
    }
    if (!agree) {
        fail("stream_lengths: positions, values and lengths disagree");
        goto done;
    }
    bits = PyMem_Malloc(sizeof(uint64_t) * (size_t)(chunks + 1));
    if (bits == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Golomb g;
    golomb_init(&g, m, 0);
    int refused = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; !refused && i < chunks; i++)
        refused = order0_bits(positions.parts[i].buf, values.parts[i].buf,
                              positions.parts[i].len / 4, width, length[i], &g, k, &bits[i]);
    Py_END_ALLOW_THREADS
    if (refused) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    for (Py_ssize_t i = 0; i < chunks; i++)
        bits[i] = (bits[i] + 7) / 8;
    result = PyTuple_New(chunks);
    for (Py_ssize_t i = 0; result != NULL && i < chunks; i++) {
        PyObject *item = PyLong_FromUnsignedLongLong(bits[i]);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, i, item);
    }
done:
    PyMem_Free(bits);
    buffers_release(&positions);
    buffers_release(&values);
    PyBuffer_Release(&lengths);
    return result;
}

/* ---- a sparse chunk's planes ----------------------------------------------------------
 *
 * sparse_planes(positions_u32, values, width) -> (gap_planes, planes): the byte planes of
 * a chunk's sparse payload before compression (sparse.planes_of_changes: the gaps between
 * changes as uint32, their low 1-3 bytes, then each byte of the zigzag differences), each
 * as bytes, or None where every byte is zero (stored as an empty frame). One pass where
 * numpy took a diff, a max, casts and a strided copy per plane. */
static PyObject *
sparse_planes(PyObject *self, PyObject *args)
{
    Py_buffer positions, values;
    int width;
    if (!PyArg_ParseTuple(args, "y*y*i", &positions, &values, &width))
        return NULL;
    PyObject *result = NULL, *list = NULL;
    Py_ssize_t n = positions.len / 4;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || positions.len % 4 ||
        values.len != (Py_ssize_t)width * n || n == 0) {
        fail("sparse_planes: positions and values disagree");
        goto done;
    }
    const uint32_t *pos = positions.buf;
    uint32_t largest = pos[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (pos[i] <= pos[i - 1]) {
            fail("sparse_planes: positions must increase");
            goto done;
        }
        uint32_t gap = pos[i] - pos[i - 1] - 1;
        largest = gap > largest ? gap : largest;
    }
    int gap_planes = largest < (1u << 8) ? 1 : (largest < (1u << 16) ? 2 : 3);
    list = PyList_New(gap_planes + width);
    if (list == NULL)
        goto done;
    const uint8_t *v = values.buf;
    for (int j = 0; j < gap_planes + width; j++) {
        PyObject *plane = PyBytes_FromStringAndSize(NULL, n);
        if (plane == NULL)
            goto done;
        uint8_t *out = (uint8_t *)PyBytes_AS_STRING(plane);
        uint8_t any = 0;
        if (j < gap_planes) {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint32_t gap = i ? pos[i] - pos[i - 1] - 1 : pos[0];
                out[i] = (uint8_t)(gap >> (8 * j));
                any |= out[i];
            }
        } else {
            const uint8_t *at = v + (j - gap_planes); /* byte j of each word, in memory */
            for (Py_ssize_t i = 0; i < n; i++) {
                out[i] = at[(Py_ssize_t)width * i];
                any |= out[i];
            }
        }
        if (!any) {
            Py_DECREF(plane);
            plane = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(list, j, plane);
    }
    result = Py_BuildValue("iO", gap_planes, list);
done:
    Py_XDECREF(list);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&values);
    return result;
}

/* ---- finding a chunk's changes -----------------------------------------------------
 *
 * What the encoder needs from a chunk's new and previous words, in one pass without the
 * GIL, where numpy took one pass per question (compare, count, nonzero, gather, subtract,
 * and a histogram through a widening cast): how many words differ, their positions (u32,
 * in the chunk) and zigzag differences when asked, and how many previous words have
 * each key (the context model's counts) when asked. Words are compared 8 bytes at a
 * time; the histogram spreads its increments over four tables, so consecutive equal keys
 * do not wait on each other. */
#define SCAN_SUB 4096
#define COUNT_KEYS(B, S, E, SHIFT, MASK)                                                  \
    do {                                                                                  \
        Py_ssize_t h = (S);                                                               \
        for (; h + 4 <= (E); h += 4) {                                                    \
            sub[(B[h] >> (SHIFT)) & (MASK)]++;                                            \
            sub[size + ((B[h + 1] >> (SHIFT)) & (MASK))]++;                               \
            sub[2 * size + ((B[h + 2] >> (SHIFT)) & (MASK))]++;                           \
            sub[3 * size + ((B[h + 3] >> (SHIFT)) & (MASK))]++;                           \
        }                                                                                 \
        for (; h < (E); h++)                                                              \
            sub[(B[h] >> (SHIFT)) & (MASK)]++;                                            \
    } while (0)
#define SCAN_LOOP(TYPE)                                                                   \
    do {                                                                                  \
        const TYPE *a = (const TYPE *)new_words;                                          \
        const TYPE *b = (const TYPE *)old_words;                                          \
        const Py_ssize_t per = 8 / (Py_ssize_t)sizeof(TYPE);                              \
        for (Py_ssize_t s = 0; s < n; s += SCAN_SUB) {                                    \
            Py_ssize_t e = n - s < SCAN_SUB ? n : s + SCAN_SUB, i = s;                    \
            for (; i + per <= e; i += per) {                                              \
                uint64_t x, y;                                                            \
                memcpy(&x, a + i, 8);                                                     \
                memcpy(&y, b + i, 8);                                                     \
                if (x == y)                                                               \
                    continue;                                                             \
                for (Py_ssize_t j = i; j < i + per; j++)                                  \
                    if (a[j] != b[j])                                                     \
                        SCAN_RECORD(j, a[j], b[j]);                                       \
            }                                                                             \
            for (; i < e; i++)                                                            \
                if (a[i] != b[i])                                                         \
                    SCAN_RECORD(i, a[i], b[i]);                                           \
            if (sub != NULL) {                                                            \
                if (sizeof(TYPE) == 2 && shift == 7 && mask == 0xFF)                      \
                    COUNT_KEYS(b, s, e, 7, 0xFF); /* bf16: constants, a third faster */   \
                else                                                                      \
                    COUNT_KEYS(b, s, e, shift, mask);                                     \
            }                                                                             \
        }                                                                                 \
    } while (0)
#define SCAN_RECORD(I, NEW, OLD)                                                          \
    do {                                                                                  \
        if (collect) {                                                                    \
            uint64_t d_ = ((uint64_t)(NEW) - (uint64_t)(OLD)) & wmask;                    \
            uint64_t neg_ = (d_ >> (bits - 1)) & 1;                                       \
            pos_out[count] = (uint32_t)(I);                                               \
            store_word(val_out, width, count, ((d_ << 1) ^ (0 - neg_)) & wmask);          \
            if (keys_out != NULL)                                                         \
                keys_out[count] = (uint16_t)(((uint64_t)(OLD) >> shift) & mask);          \
        }                                                                                 \
        count++;                                                                          \
    } while (0)

#ifdef HAVE_SIMD
/* 2-byte words with a key of 4 to 8 bits (bf16, f16) on AVX2: one pass over both arrays,
 * 32 elements a step: the words compared 16 at a time (a step without a change costs two
 * compares), and the previous words' keys counted for a window of 16 keys with a compare
 * and a subtract per key into 8-bit lanes (summed every 255 steps); a key outside the
 * window (rare: weights' exponents cluster) is counted one by one. The window is the
 * 16 keys most common in the first SCAN_SUB elements, counted the portable way. The same
 * changes and counts as SCAN_LOOP: tests run both. */
typedef struct {
    const uint16_t *a, *b; /* new, previous */
    Py_ssize_t n;
    int shift;
    uint64_t mask;
    Py_ssize_t size;
    uint32_t *sub; /* the portable path's four tables (the first one is used here) */
    int collect;
    uint32_t *pos_out;
    uint8_t *val_out;
    uint16_t *keys_out; /* each change's previous key, or NULL */
    Py_ssize_t count;
    int base;            /* the window's first key */
    uint64_t window[16]; /* its keys' counts, outside `sub` */
} Scan16;

#define SCAN16_RECORD(I)                                                                  \
    do {                                                                                  \
        if (s->collect) {                                                                 \
            uint16_t d_ = (uint16_t)(a[I] - b[I]);                                        \
            uint16_t zig_ = (uint16_t)((uint16_t)(d_ << 1) ^ (uint16_t)(0 - (d_ >> 15)));  \
            s->pos_out[count] = (uint32_t)(I);                                            \
            memcpy(s->val_out + 2 * count, &zig_, 2);                                     \
            if (s->keys_out != NULL)                                                      \
                s->keys_out[count] = (uint16_t)((b[I] >> shift) & mask);                  \
        }                                                                                 \
        count++;                                                                          \
    } while (0)

SIMD_TARGET static void
scan16_simd(Scan16 *s)
{
    const uint16_t *a = s->a, *b = s->b;
    Py_ssize_t n = s->n, count = 0, i = 0, size = s->size;
    int shift = s->shift;
    uint64_t mask = s->mask;
    uint32_t *sub = s->sub;
    Py_ssize_t head = n < SCAN_SUB ? n : SCAN_SUB;
    for (; i < head; i++) {
        if (a[i] != b[i])
            SCAN16_RECORD(i);
        sub[(b[i] >> shift) & mask]++;
    }
    int base = 0;
    uint32_t best = 0;
    for (Py_ssize_t start = 0; start + 16 <= size; start++) {
        uint32_t in = 0;
        for (int q = 0; q < 16; q++)
            in += sub[start + q];
        if (in > best) {
            best = in;
            base = (int)start;
        }
    }
    s->base = base;
    for (int q = 0; q < 16; q++)
        s->window[q] = 0;
    const __m128i shift_by = _mm_cvtsi32_si128(shift);
    const __m256i keys = _mm256_set1_epi16((short)mask);
    const __m256i first = _mm256_set1_epi8((char)base), fifteen = _mm256_set1_epi8(15);
    const __m256i zero = _mm256_setzero_si256();
    while (i + 32 <= n) {
        __m256i acc[16];
        for (int q = 0; q < 16; q++)
            acc[q] = zero;
        for (int steps = 0; steps < 255 && i + 32 <= n; steps++, i += 32) {
            __m256i o0 = _mm256_loadu_si256((const __m256i *)(b + i));
            __m256i o1 = _mm256_loadu_si256((const __m256i *)(b + i + 16));
            __m256i n0 = _mm256_loadu_si256((const __m256i *)(a + i));
            __m256i n1 = _mm256_loadu_si256((const __m256i *)(a + i + 16));
            uint64_t same = (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi16(n0, o0)) |
                            (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi16(n1, o1))
                                << 32;
            if (~same) {
                uint64_t changed = ~same & 0x5555555555555555ULL; /* a bit per word */
                while (changed) {
                    Py_ssize_t j = i + (_tzcnt_u64(changed) >> 1);
                    changed &= changed - 1;
                    SCAN16_RECORD(j);
                }
            }
            __m256i k0 = _mm256_and_si256(_mm256_srl_epi16(o0, shift_by), keys);
            __m256i k1 = _mm256_and_si256(_mm256_srl_epi16(o1, shift_by), keys);
            /* keys < 256 fit a byte; the window's index wraps to >= 16 below it (base <=
             * size - 16) */
            __m256i d = _mm256_sub_epi8(
                _mm256_permute4x64_epi64(_mm256_packus_epi16(k0, k1), 0xD8), first);
            uint32_t outside =
                ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(d, fifteen), d));
            while (outside) {
                Py_ssize_t j = i + _tzcnt_u32(outside);
                outside &= outside - 1;
                sub[(b[j] >> shift) & mask]++;
            }
            for (int q = 0; q < 16; q++)
                acc[q] = _mm256_sub_epi8(acc[q], _mm256_cmpeq_epi8(d, _mm256_set1_epi8((char)q)));
        }
        for (int q = 0; q < 16; q++) {
            uint64_t lanes[4];
            _mm256_storeu_si256((__m256i *)lanes, _mm256_sad_epu8(acc[q], zero));
            s->window[q] += lanes[0] + lanes[1] + lanes[2] + lanes[3];
        }
    }
    for (; i < n; i++) {
        if (a[i] != b[i])
            SCAN16_RECORD(i);
        sub[(b[i] >> shift) & mask]++;
    }
    s->count = count;
}
#undef SCAN16_RECORD
#endif

static PyObject *
scan_chunk(PyObject *self, PyObject *args)
{
    Py_buffer new_buf, old_buf, positions, values, hist, keys = {0};
    int width, shift, key_bits, want_simd = 1;
    if (!PyArg_ParseTuple(args, "y*y*iiiw*w*w*|pw*", &new_buf, &old_buf, &width, &shift,
                          &key_bits, &positions, &values, &hist, &want_simd, &keys))
        return NULL;
    const char *error = NULL;
    Py_ssize_t count = 0;
    Py_ssize_t n = new_buf.len / (width > 0 ? width : 1);
    Py_ssize_t size = (Py_ssize_t)1 << (key_bits >= 0 && key_bits <= MAX_KEY_BITS ? key_bits : 0);
    uint32_t *sub = NULL;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || new_buf.len % width ||
        old_buf.len != new_buf.len || n > 0xFFFFFFFFLL) {
        error = "scan_chunk: the words disagree";
    } else if (key_bits < 0 || key_bits > MAX_KEY_BITS || shift < 0 ||
               shift + key_bits > 8 * width) {
        error = "scan_chunk: key outside the word";
    } else if (!((positions.len == 0 && values.len == 0) ||
                 (positions.len == 4 * n && values.len == (Py_ssize_t)width * n)) ||
               (hist.len != 0 && hist.len != 8 * size) ||
               (keys.len != 0 && (keys.len != 2 * n || positions.len == 0))) {
        error = "scan_chunk: output buffers disagree with the chunk";
    } else if (hist.len && (sub = PyMem_Calloc(4 * (size_t)size, sizeof(uint32_t))) == NULL) {
        PyErr_NoMemory();
        goto done;
    } else {
        const uint8_t *new_words = new_buf.buf, *old_words = old_buf.buf;
        uint32_t *pos_out = positions.buf;
        uint8_t *val_out = values.buf;
        uint16_t *keys_out = keys.len ? keys.buf : NULL;
        int collect = positions.len != 0, bits = 8 * width;
        uint64_t wmask = width == 8 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
        uint64_t mask = (uint64_t)size - 1;
        int base = 0;
        uint64_t window[16] = {0};
        Py_BEGIN_ALLOW_THREADS
#ifdef HAVE_SIMD
        if (want_simd && simd_usable && width == 2 && sub != NULL && size >= 16 && size <= 256) {
            Scan16 scan = {(const uint16_t *)new_words, (const uint16_t *)old_words, n, shift,
                           mask, size, sub, collect, pos_out, val_out, keys_out, 0, 0, {0}};
            scan16_simd(&scan);
            count = scan.count;
            base = scan.base;
            memcpy(window, scan.window, sizeof window);
            goto counted;
        }
#endif
        switch (width) {
        case 1:
            SCAN_LOOP(uint8_t);
            break;
        case 2:
            SCAN_LOOP(uint16_t);
            break;
        case 4:
            SCAN_LOOP(uint32_t);
            break;
        default:
            SCAN_LOOP(uint64_t);
        }
#ifdef HAVE_SIMD
    counted:
#endif
        if (sub != NULL) {
            int64_t *out = hist.buf;
            for (Py_ssize_t key = 0; key < size; key++)
                out[key] = (int64_t)sub[key] + sub[size + key] + sub[2 * size + key] +
                           sub[3 * size + key] +
                           (int64_t)(key >= base && key < base + 16 ? window[key - base] : 0);
        }
        Py_END_ALLOW_THREADS
    }
done:
    PyMem_Free(sub);
    PyBuffer_Release(&new_buf);
    PyBuffer_Release(&old_buf);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&values);
    PyBuffer_Release(&hist);
    PyBuffer_Release(&keys);
    if (error)
        return fail(error);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(count);
}
#undef SCAN_RECORD
#undef SCAN_LOOP
#undef COUNT_KEYS

/* ---- applying decoded changes ------------------------------------------------------
 *
 * words[p] += unzigzag(zig) (wrapping in the word's width) at each change, the words that
 * were there written back over zig: the undo record of a patch. One pass without the GIL
 * where numpy's gather, unzigzag, add and scatter took five, holding it. Every position
 * is checked before anything is written, so a refused call leaves the words untouched. */
/* Position i of a uint32 (width 4) or int64 (width 8) array; a negative one as the
 * largest value, so that a bounds check refuses it. */
static inline uint64_t
position_at(const uint8_t *at, int width, Py_ssize_t i)
{
    if (width == 4) {
        uint32_t q;
        memcpy(&q, at + 4 * i, 4);
        return q;
    }
    int64_t q;
    memcpy(&q, at + 8 * i, 8);
    return q < 0 ? UINT64_MAX : (uint64_t)q;
}

static PyObject *
apply_changes(PyObject *self, PyObject *args)
{
    Py_buffer words, positions, zig;
    int width, position_width;
    if (!PyArg_ParseTuple(args, "w*iy*iw*", &words, &width, &positions, &position_width, &zig))
        return NULL;
    const char *error = NULL;
    Py_ssize_t n = words.len / (width > 0 ? width : 1);
    Py_ssize_t count = zig.len / (width > 0 ? width : 1);
    if ((width != 1 && width != 2 && width != 4 && width != 8) ||
        (position_width != 4 && position_width != 8) || words.len % width ||
        zig.len % width || positions.len != (Py_ssize_t)position_width * count) {
        error = "apply_changes: words, positions and differences disagree";
    } else {
        const uint8_t *at = positions.buf;
        uint8_t *base = words.buf;
        uint8_t *values = zig.buf;
        uint64_t mask = width == 8 ? ~(uint64_t)0 : (((uint64_t)1 << (8 * width)) - 1);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count && !error; i++)
            if (position_at(at, position_width, i) >= (uint64_t)n)
                error = "apply_changes: a change's position lies outside the words";
        for (Py_ssize_t i = 0; i < count && !error; i++) {
            uint64_t p = position_at(at, position_width, i);
            uint64_t v = word_at(values, width, i);
            uint64_t before = word_at(base, width, (Py_ssize_t)p);
            uint64_t difference = (v >> 1) ^ (0 - (v & 1));
            store_word(base, width, (Py_ssize_t)p, (before + difference) & mask);
            store_word(values, width, i, before);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&words);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&zig);
    if (error)
        return fail(error);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_chunk", decode_chunk, METH_VARARGS,
     "decode_chunk(prev, width, shift, key_bits, lo, golomb, value_k, stream, changes, "
     "positions_out, values_out, simd=True): fill the chunk's changed positions (u32) and "
     "zigzag differences; ValueError when the stream is malformed. simd=False forces the "
     "portable loop (the same results; tests run both)."},
    {"apply_changes", apply_changes, METH_VARARGS,
     "apply_changes(words, width, positions, position_width, zig): words[p] += "
     "unzigzag(zig) at each position (wrapping), the previous words written back over zig; "
     "ValueError, with nothing written, when a position lies outside."},
    {"encode_chunk", encode_chunk, METH_VARARGS,
     "encode_chunk(prev, width, shift, key_bits, lo, golomb, value_k, positions, values, "
     "simd=True) -> bytes: the chunk's bitstream. simd=False forces the portable scan (the "
     "same bytes; tests run both)."},
    {"value_orders", value_orders, METH_VARARGS,
     "value_orders(magnitudes_u64, change_class_i64, classes) -> bytes | None: each "
     "class's Exp-Golomb order (255: all magnitudes 1); None when a magnitude is too large "
     "for integer lengths to match the reference's float ones."},
    {"model_prepare", model_prepare, METH_VARARGS,
     "model_prepare(per_key_i64, changed_i64, classes) -> (first, count, rows): the context "
     "model's candidate windows and the terms of their entropies (float64 rows p, a, b, n)."},
    {"model_finish", model_finish, METH_VARARGS,
     "model_finish(rows, logs, per_key, changed, first, count, classes) -> (lo, elements, "
     "changes): the cheapest window from log2 of rows a and b, and its classes' counts."},
    {"fit_prepare", fit_prepare, METH_VARARGS,
     "fit_prepare(keys, per_key_i64, classes) -> (changed, first, count, rows): each key's "
     "changes counted from the chunks' keys (u16 buffers), and model_prepare of them."},
    {"fit_finish", fit_finish, METH_VARARGS,
     "fit_finish(values, width, keys, elements, window) -> (lo, golomb, value_k) | None: "
     "the context model of the chunks' changes (zigzag differences); keys and window None "
     "(one class, no key) or the chunks' keys and (rows, logs, per_key, changed, first, "
     "count, classes). None when a magnitude is too large for exact orders."},
    {"stream_lengths", stream_lengths, METH_VARARGS,
     "stream_lengths(positions, values, lengths_u64, width, golomb, value_k) -> (bytes, ...) "
     "| None: each chunk's encode_chunk stream length with one class and no key, unwritten; "
     "None where encode_chunk would refuse a change."},
    {"sparse_planes", sparse_planes, METH_VARARGS,
     "sparse_planes(positions_u32, values, width) -> (gap_planes, planes): a sparse chunk's "
     "byte planes, None for an all-zero one."},
    {"scan_chunk", scan_chunk, METH_VARARGS,
     "scan_chunk(new, old, width, shift, key_bits, positions_out, values_out, hist_out, "
     "simd=True, keys_out=None) -> changes: the words that differ; their positions (u32) "
     "and zigzag differences into the outputs (the chunk's length each, or both empty to "
     "count only); hist_out (int64, 2**key_bits, or empty) the previous words' keys "
     "counted; keys_out (u16, the chunk's length, with positions) each change's previous "
     "key. simd=False forces the portable loop (the same results; tests run both)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_context", "Native kernels of the context codec.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__context(void)
{
#ifdef HAVE_SIMD
    __builtin_cpu_init();
    simd_usable = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2") &&
                  __builtin_cpu_supports("popcnt");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "SIMD", simd_usable) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
