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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CLASSES 8
#define MAX_KEY_BITS 12
#define UNIT_MAGNITUDES 255

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
    int b;           /* ceil(log2 m) */
} Golomb;

static inline void
golomb_init(Golomb *g, uint64_t m, uint64_t limit)
{
    g->m = m;
    g->limit = limit;
    g->qlimit = limit / m + 1;
    g->b = m == 1 ? 0 : 64 - __builtin_clzll(m - 1);
    g->cut = m == 1 ? 0 : ((uint64_t)1 << g->b) - m;
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

/* ---- bit writer ------------------------------------------------------------------ */

typedef struct {
    uint8_t *data;
    Py_ssize_t size;
    Py_ssize_t capacity;
    uint64_t buf;
    int nbits;
} Writer;

static int
writer_reserve(Writer *w, Py_ssize_t more)
{
    if (w->size + more <= w->capacity)
        return 0;
    Py_ssize_t capacity = w->capacity ? w->capacity : 256;
    while (capacity < w->size + more)
        capacity *= 2;
    uint8_t *data = PyMem_RawRealloc(w->data, (size_t)capacity);
    if (data == NULL)
        return -1;
    w->data = data;
    w->capacity = capacity;
    return 0;
}

/* n <= 32 */
static inline int
put_bits(Writer *w, uint64_t value, int n)
{
    if (n == 0)
        return 0;
    w->buf |= (value & (((uint64_t)1 << n) - 1)) << w->nbits;
    w->nbits += n;
    if (w->nbits >= 32) {
        if (writer_reserve(w, 4) < 0)
            return -1;
        for (int i = 0; i < 4; i++) {
            w->data[w->size++] = (uint8_t)(w->buf & 0xFF);
            w->buf >>= 8;
        }
        w->nbits -= 32;
    }
    return 0;
}

static inline int
put_unary(Writer *w, uint64_t zeros)
{
    while (zeros >= 32) {
        if (put_bits(w, 0, 32) < 0)
            return -1;
        zeros -= 32;
    }
    if (put_bits(w, 0, (int)zeros) < 0)
        return -1;
    return put_bits(w, 1, 1);
}

static inline int
put_golomb(Writer *w, uint64_t value, uint64_t m)
{
    if (put_unary(w, value / m) < 0)
        return -1;
    if (m == 1)
        return 0;
    uint64_t low = value % m;
    int b = 64 - __builtin_clzll(m - 1);
    uint64_t cut = ((uint64_t)1 << b) - m;
    if (low < cut)
        return put_bits(w, low, b - 1);
    low += cut; /* b bits: the first b-1 (high) bits, then the last one */
    if (put_bits(w, low >> 1, b - 1) < 0)
        return -1;
    return put_bits(w, low & 1, 1);
}

static inline int
put_exp_golomb(Writer *w, uint64_t value, int k)
{
    uint64_t shifted = value + ((uint64_t)1 << k);
    int n = 63 - __builtin_clzll(shifted); /* floor(log2) */
    if (put_unary(w, (uint64_t)(n - k)) < 0)
        return -1;
    uint64_t low = shifted - ((uint64_t)1 << n);
    if (n > 32) {
        if (put_bits(w, low & 0xFFFFFFFFu, 32) < 0)
            return -1;
        return put_bits(w, low >> 32, n - 32);
    }
    return put_bits(w, low, n);
}

static int
writer_finish(Writer *w)
{
    while (w->nbits > 0) {
        if (writer_reserve(w, 1) < 0)
            return -1;
        w->data[w->size++] = (uint8_t)(w->buf & 0xFF);
        w->buf >>= 8;
        w->nbits = w->nbits > 8 ? w->nbits - 8 : 0;
    }
    return 0;
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

/* ---- encode ---------------------------------------------------------------------- */

static PyObject *
encode_chunk(PyObject *self, PyObject *args)
{
    Py_buffer prev, golomb, value_k, positions, values;
    int width, shift, key_bits, lo;
    if (!PyArg_ParseTuple(args, "y*iiiiy*y*y*y*", &prev, &width, &shift, &key_bits, &lo,
                          &golomb, &value_k, &positions, &values))
        return NULL;
    const char *error = NULL;
    PyObject *result = NULL;
    Params p;
    Writer w = {NULL, 0, 0, 0, 0};
    uint64_t *next_gap = NULL;
    uint8_t *change_class = NULL;
    uint64_t since[MAX_CLASSES];
    if (parse_params(&p, width, shift, key_bits, lo, &golomb, &value_k) < 0) {
        error = "context parameters out of range";
        goto done;
    }
    Py_ssize_t n = prev.len / width;
    Py_ssize_t changes = positions.len / 4;
    if (prev.len % width || positions.len % 4 || values.len != (Py_ssize_t)width * changes) {
        error = "context buffers disagree with the chunk";
        goto done;
    }
    const uint32_t *pos = positions.buf;
    for (Py_ssize_t t = 0; t < changes; t++)
        if (pos[t] >= n || (t && pos[t] <= pos[t - 1])) {
            error = "positions must be increasing and inside the chunk";
            goto done;
        }
    next_gap = PyMem_Malloc(sizeof(uint64_t) * (size_t)(changes + 1));
    change_class = PyMem_Malloc((size_t)(changes + 1));
    if (next_gap == NULL || change_class == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t mask = ((uint64_t)1 << key_bits) - 1;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    /* backwards: each change's following gap in its class, then the first gaps */
    for (int c = 0; c < p.classes; c++)
        since[c] = 0;
    Py_ssize_t t = changes - 1;
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        int c = p.table[(word_at(prev.buf, width, i) >> shift) & mask];
        if (t >= 0 && pos[t] == (uint32_t)i) {
            next_gap[t] = since[c];
            change_class[t] = (uint8_t)c;
            since[c] = 0;
            t--;
        } else {
            since[c]++;
        }
    }
    for (int c = 0; c < p.classes && !failed; c++)
        failed = put_golomb(&w, since[c], p.golomb[c]) < 0;
    for (t = 0; t < changes && !failed; t++) {
        int c = change_class[t];
        uint64_t v = word_at(values.buf, width, t);
        if (v == 0) {
            failed = 2;
            break;
        }
        uint64_t sign = v & 1, magnitude = (v >> 1) + sign;
        failed = put_bits(&w, sign, 1) < 0;
        if (!failed && p.value_k[c] != UNIT_MAGNITUDES)
            failed = put_exp_golomb(&w, magnitude - 1, p.value_k[c]) < 0;
        else if (!failed && magnitude != 1)
            failed = 3;
        if (!failed)
            failed = put_golomb(&w, next_gap[t], p.golomb[c]) < 0;
    }
    if (!failed)
        failed = writer_finish(&w) < 0;
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
    PyMem_Free(next_gap);
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
     "encode_chunk(prev, width, shift, key_bits, lo, golomb, value_k, positions, values) "
     "-> bytes: the chunk's bitstream."},
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
