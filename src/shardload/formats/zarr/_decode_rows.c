/* Blosc inner chunks of a local shard file decoded into the places their rows go.
 *
 * The optional compiled part of shardload (setup.py builds it where a C compiler is found;
 * without it the loader reads compressed shards into group buffers and gathers batches out of
 * them, formats/zarr/shard_rows.py). One call reads a shard's chunks (sorted by offset; runs
 * of neighbours with one pread), checks each one's Blosc header, decodes it into a small
 * buffer that stays in the CPU's cache and copies each of its rows to its own address (a row
 * of a batch), all without the GIL. It links no Blosc: it calls blosc_decompress_ctx of
 * numcodecs' extension at the address Python gives (ctypes).
 *
 * It stops at the first chunk it cannot serve (a short or failed read, a header that does not
 * match, a decode that fails) and returns its position; Python reads that chunk again, decodes
 * it or raises the error naming it, and calls again from the next one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef int (*decompress_fn)(const void *src, void *dest, size_t destsize, int threads);

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* One inner chunk at src (size bytes): its Blosc header checked against the index and the
 * layout (compressed and decoded sizes, type size, shuffle bits; shuffle -1: any), decoded into
 * tmp and each of its rows copied to its address in to (0: nowhere). 0 where it cannot serve. */
static int serve_chunk(decompress_fn decompress, const unsigned char *src, int64_t size,
                       int64_t full, Py_ssize_t typesize_a, Py_ssize_t typesize_b,
                       Py_ssize_t shuffle, unsigned char *tmp, unsigned char *const *to,
                       Py_ssize_t rows, Py_ssize_t row_bytes) {
    const Py_ssize_t typesize = src[3];
    if ((int64_t)le32(src + 12) != size || (int64_t)le32(src + 4) != full ||
        (typesize != typesize_a && typesize != typesize_b) ||
        (shuffle >= 0 && (src[2] & 0x05) != shuffle))
        return 0;
    if (decompress(src, tmp, (size_t)full, 1) != (int)full)
        return 0;
    for (Py_ssize_t r = 0; r < rows; r++)
        if (to[r])
            memcpy(to[r], tmp + r * row_bytes, (size_t)row_bytes);
    return 1;
}

/* want bytes at `at` (fewer only where the file ends); -1 on an error */
static int64_t pread_full(int fd, unsigned char *buf, size_t want, int64_t at) {
    size_t got = 0;
    while (got < want) {
        ssize_t r = pread(fd, buf + got, want - got, (off_t)(at + (int64_t)got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (int64_t)got;
}

/* decode_rows(fn, fd, offsets, sizes, start, n, dst, rows, row_bytes, typesize_a, typesize_b,
 *             shuffle, scratch, scratch_bytes, tmp) -> the position of the first chunk not
 *             served (n: all)
 *
 * offsets, sizes: int64[n], chunk i's bytes in the file (sorted by offset); dst: uint64[n *
 * rows], where row r of chunk i goes (0: nowhere); typesize_a, typesize_b: the type sizes a
 * header may carry; shuffle: its flags' shuffle bits (0x01 | 0x04), or -1 for any (as
 * ChunkLayout.blosc_header says); scratch: scratch_bytes for the compressed runs; tmp: rows *
 * row_bytes for one decoded chunk. Every address is the caller's, alive for the call. */
static PyObject *decode_rows(PyObject *self, PyObject *args) {
    unsigned long long fn_a, offs_a, sizes_a, dst_a, scratch_a, tmp_a;
    int fd;
    Py_ssize_t start, n, rows, row_bytes, typesize_a, typesize_b, shuffle, scratch_bytes;
    if (!PyArg_ParseTuple(args, "KiKKnnKnnnnnKnK", &fn_a, &fd, &offs_a, &sizes_a, &start, &n,
                          &dst_a, &rows, &row_bytes, &typesize_a, &typesize_b, &shuffle,
                          &scratch_a, &scratch_bytes, &tmp_a))
        return NULL;
    decompress_fn decompress = (decompress_fn)(uintptr_t)fn_a;
    const int64_t *offs = (const int64_t *)(uintptr_t)offs_a;
    const int64_t *sizes = (const int64_t *)(uintptr_t)sizes_a;
    unsigned char *const *dst = (unsigned char *const *)(uintptr_t)dst_a;
    unsigned char *scratch = (unsigned char *)(uintptr_t)scratch_a;
    unsigned char *tmp = (unsigned char *)(uintptr_t)tmp_a;
    const int64_t full = (int64_t)rows * (int64_t)row_bytes;
    int64_t run_at = 0, run_got = -1; /* scratch holds the file's bytes [run_at, run_at + run_got) */
    Py_ssize_t i = start;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        const int64_t off = offs[i], size = sizes[i];
        if (off < 0 || size < 16 || size > scratch_bytes || full > INT32_MAX)
            break; /* (the index is checked: off + size is inside the file) */
        if (off < run_at || off + size > run_at + run_got) { /* a run of neighbours from here */
            int64_t end = off + size;
            for (Py_ssize_t j = i + 1; j < n && offs[j] == end && end + sizes[j] - off <= scratch_bytes; j++)
                end += sizes[j];
            run_at = off;
            run_got = pread_full(fd, scratch, (size_t)(end - off), off);
            if (run_got < size) {
                run_got = -1;
                break;
            }
        }
        if (!serve_chunk(decompress, scratch + (off - run_at), size, full, typesize_a,
                         typesize_b, shuffle, tmp, dst + i * rows, rows, row_bytes))
            break;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(i);
}

static PyObject *decode_rows_buf(PyObject *self, PyObject *args); /* below */
PyObject *stats_f32(PyObject *self, PyObject *args);            /* _stats_f32.c */

static PyMethodDef methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS,
     "Decode Blosc inner chunks of a shard file, each row to its own address."},
    {"decode_rows_buf", decode_rows_buf, METH_VARARGS,
     "Decode Blosc inner chunks of a shard's bytes in memory, each row to its own address."},
    {"stats_f32", stats_f32, METH_VARARGS,
     "Sums, minimum and maximum of a float32 block's features (prepare's statistics)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_rows", NULL, -1, methods};

/* ABI: the arguments of decode_rows and decode_rows_buf, as shard_rows.py and url_rows.py
 * call them (a build of another is not used); STATS_ABI: those of stats_f32, as
 * prep/stats/block.py calls it */
PyMODINIT_FUNC PyInit__decode_rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", 3) < 0 ||
                      PyModule_AddIntConstant(m, "STATS_ABI", 1) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}


/* decode_rows_buf(fn, buf, buf_bytes, offsets, sizes, start, n, dst, rows, row_bytes, typesize_a,
 *                 typesize_b, shuffle, tmp) -> the position of the first chunk not served (n: all)
 *
 * decode_rows for a shard whose bytes are in memory already (fetched by URL and checked
 * against its checksum): chunk i is bytes [offsets[i], offsets[i] + sizes[i]) of buf
 * (buf_bytes long); a chunk that does not lie wholly inside it is not served (Python names
 * it, as a truncated one). No read, no scratch: the same header checks, decode and copies. */
static PyObject *decode_rows_buf(PyObject *self, PyObject *args) {
    unsigned long long fn_a, buf_a, offs_a, sizes_a, dst_a, tmp_a;
    Py_ssize_t buf_bytes, start, n, rows, row_bytes, typesize_a, typesize_b, shuffle;
    if (!PyArg_ParseTuple(args, "KKnKKnnKnnnnnK", &fn_a, &buf_a, &buf_bytes, &offs_a, &sizes_a,
                          &start, &n, &dst_a, &rows, &row_bytes, &typesize_a, &typesize_b,
                          &shuffle, &tmp_a))
        return NULL;
    decompress_fn decompress = (decompress_fn)(uintptr_t)fn_a;
    const unsigned char *buf = (const unsigned char *)(uintptr_t)buf_a;
    const int64_t *offs = (const int64_t *)(uintptr_t)offs_a;
    const int64_t *sizes = (const int64_t *)(uintptr_t)sizes_a;
    unsigned char *const *dst = (unsigned char *const *)(uintptr_t)dst_a;
    unsigned char *tmp = (unsigned char *)(uintptr_t)tmp_a;
    const int64_t full = (int64_t)rows * (int64_t)row_bytes;
    Py_ssize_t i = start;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        const int64_t off = offs[i], size = sizes[i];
        if (size < 16 || off < 0 || size > (int64_t)buf_bytes || off > (int64_t)buf_bytes - size ||
            full > INT32_MAX)
            break;
        if (!serve_chunk(decompress, buf + off, size, full, typesize_a, typesize_b, shuffle, tmp,
                         dst + i * rows, rows, row_bytes))
            break;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(i);
}
