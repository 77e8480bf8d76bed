/* Native kernel of the split XXH3-128 (stream_hash.py): the long-input stripe loop.
 *
 * A sharded trainer's tensor is hashed by its ranks in turn, each over its own rows, the
 * hash state passed from one to the next (docs/publishing.md): the result must be the
 * xxh3-128 of the whole tensor, as a single process computes it. Everything but the
 * stripe loop (the buffering, the short inputs, the last stripe and the final merge) is
 * Python in stream_hash.py; this is the loop over the bytes, written from the XXH3
 * specification (xxhash_spec.md, "XXH3 Algorithm Description (for large inputs)") for
 * the default 192-byte secret: per 64-byte stripe, each of the 8 lanes adds the data to
 * its neighbour's accumulator and the product of the low and high halves of
 * (data XOR secret) to its own; after every 16 stripes (a 1 KiB block) the accumulators
 * are scrambled. It runs without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define STRIPE 64
#define STRIPES_PER_BLOCK 16
#define SECRET_SIZE 192
#define PRIME32_1 0x9E3779B1U

static const uint8_t SECRET[SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t
read64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only (checked at import) */
    return v;
}

static inline void
accumulate(uint64_t acc[8], const uint8_t *stripe, const uint8_t *secret)
{
    for (int i = 0; i < 8; i++) {
        uint64_t data = read64(stripe + 8 * i);
        uint64_t key = data ^ read64(secret + 8 * i);
        acc[i ^ 1] += data;
        acc[i] += (key & 0xFFFFFFFFULL) * (key >> 32);
    }
}

static inline void
scramble(uint64_t acc[8])
{
    const uint8_t *secret = SECRET + SECRET_SIZE - STRIPE;
    for (int i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= read64(secret + 8 * i);
        acc[i] = a * PRIME32_1;
    }
}

/* stripes(acc: writable 64 bytes, done: stripes before these, data: whole stripes)
 * -> stripes done after them. The accumulators are updated in place. */
static PyObject *
stripes(PyObject *self, PyObject *args)
{
    Py_buffer acc_buf, data;
    unsigned long long done;
    if (!PyArg_ParseTuple(args, "w*Ky*", &acc_buf, &done, &data))
        return NULL;
    if (acc_buf.len != 64 || data.len % STRIPE) {
        PyBuffer_Release(&acc_buf);
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError,
                        "stripes: the accumulators are 64 bytes, the data whole stripes");
        return NULL;
    }
    uint64_t acc[8];
    memcpy(acc, acc_buf.buf, 64);
    const uint8_t *p = data.buf;
    Py_ssize_t count = data.len / STRIPE;
    uint64_t n = done;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++, n++) {
        unsigned position = (unsigned)(n % STRIPES_PER_BLOCK);
        accumulate(acc, p + STRIPE * i, SECRET + 8 * position);
        if (position == STRIPES_PER_BLOCK - 1)
            scramble(acc);
    }
    Py_END_ALLOW_THREADS
    memcpy(acc_buf.buf, acc, 64);
    PyBuffer_Release(&acc_buf);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLongLong(n);
}

static PyMethodDef methods[] = {
    {"stripes", stripes, METH_VARARGS,
     "Accumulate whole 64-byte stripes into the 8 XXH3 accumulators (scrambling after "
     "each block's last stripe); returns the stripe count."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_stream_hash",
    .m_doc = "The split XXH3-128's stripe loop.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__stream_hash(void)
{
    return PyModule_Create(&module);
}
