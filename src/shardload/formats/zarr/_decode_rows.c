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
 *
 * read_rows (at the end) serves the raw rows of uncompressed chunks (load/runs.py): the calls
 * the page cache holds, each read into a small buffer and its rows streamed to their places.
 */
#define _GNU_SOURCE /* preadv2, RWF_NOWAIT */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef int (*decompress_fn)(const void *src, void *dest, size_t destsize, int threads);

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* n bytes from src to dst (a batch row the caller reads later, not now) with streaming
 * stores where the CPU has them: whole cache lines of dst are written without reading them
 * from memory first (a batch row is memory no cache holds any more), the partial lines at
 * either end with plain stores. */
static void copy_out(unsigned char *dst, const unsigned char *src, size_t n) {
#if defined(__SSE2__)
    size_t head = (size_t)(-(uintptr_t)dst & 63);
    if (n < head + 64) {
        memcpy(dst, src, n);
        return;
    }
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; dst += 64, src += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    memcpy(dst, src, n);
}

/* the streamed rows are visible before the batch is handed on (another thread, a process) */
static void fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
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
            copy_out(to[r], tmp + r * row_bytes, (size_t)row_bytes);
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
    fence();
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(i);
}

static PyObject *decode_rows_buf(PyObject *self, PyObject *args); /* below */
static PyObject *read_rows(PyObject *self, PyObject *args);       /* below */
static PyObject *copy_rows_buf(PyObject *self, PyObject *args);   /* below */
PyObject *stats_f32(PyObject *self, PyObject *args);            /* _stats_f32.c */

static PyMethodDef methods[] = {
    {"decode_rows", decode_rows, METH_VARARGS,
     "Decode Blosc inner chunks of a shard file, each row to its own address."},
    {"decode_rows_buf", decode_rows_buf, METH_VARARGS,
     "Decode Blosc inner chunks of a shard's bytes in memory, each row to its own address."},
    {"read_rows", read_rows, METH_VARARGS,
     "Read runs of raw rows through a small cached buffer into their scattered places."},
    {"copy_rows_buf", copy_rows_buf, METH_VARARGS,
     "Copy raw inner chunks of a shard's bytes in memory, each row to its own address."},
    {"stats_f32", stats_f32, METH_VARARGS,
     "Sums, minimum and maximum of a float32 block's features (prepare's statistics)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode_rows", NULL, -1, methods};

/* ABI: the arguments of decode_rows, decode_rows_buf, copy_rows_buf and read_rows, as
 * shard_rows.py, url_rows.py and load/runs.py call them (a build of another is not used);
 * STATS_ABI: those of stats_f32, as prep/stats/block.py calls it */
PyMODINIT_FUNC PyInit__decode_rows(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "ABI", 5) < 0 ||
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
    fence();
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(i);
}


/* preadv2(RWF_NOWAIT) where the platform has it (Linux); elsewhere every call is "not
 * supported", as on tmpfs, and read_rows leaves the task's calls to the caller: the extension
 * still builds there, with its decode functions */
static ssize_t nowait_preadv(int fd, const struct iovec *v, int n, off_t off) {
#if defined(RWF_NOWAIT)
    return preadv2(fd, v, n, off, RWF_NOWAIT);
#else
    (void)fd, (void)v, (void)n, (void)off;
    errno = EOPNOTSUPP;
    return -1;
#endif
}

/* read_rows(fds, offsets, wants, firsts, counts, n, iov, got, stage, stage_bytes) -> None
 *
 * n read calls of raw rows, each want[i] bytes at offsets[i] of descriptor fds[i] to iovecs
 * iov[firsts[i] .. firsts[i] + counts[i]] (struct iovec: uint64 base, length; at most IOV_MAX
 * a call), served only where the page cache holds their bytes (RWF_NOWAIT: a call that would
 * wait for the disk is left to the caller's io_uring, which keeps many in flight). A call of at
 * most stage_bytes is read into stage (a small buffer that stays in the CPU's cache) and its
 * rows copied out to their places (copy_out); a longer one is one preadv2 into its places.
 * got[i]: the bytes call i read (-1: not served); its places are written only when it read
 * want[i] (or, for a long call, partly: the caller reads a call it did not get whole again).
 * On a file system that does not take RWF_NOWAIT (tmpfs), the first call says so and the rest
 * of the task's calls are left untried (-1). */
static PyObject *read_rows(PyObject *self, PyObject *args) {
    unsigned long long fds_a, offs_a, wants_a, firsts_a, counts_a, iov_a, got_a, stage_a;
    Py_ssize_t n, stage_bytes;
    if (!PyArg_ParseTuple(args, "KKKKKnKKKn", &fds_a, &offs_a, &wants_a, &firsts_a, &counts_a,
                          &n, &iov_a, &got_a, &stage_a, &stage_bytes))
        return NULL;
    const int64_t *fds = (const int64_t *)(uintptr_t)fds_a;
    const int64_t *offs = (const int64_t *)(uintptr_t)offs_a;
    const int64_t *wants = (const int64_t *)(uintptr_t)wants_a;
    const int64_t *firsts = (const int64_t *)(uintptr_t)firsts_a;
    const int64_t *counts = (const int64_t *)(uintptr_t)counts_a;
    const struct iovec *iov = (const struct iovec *)(uintptr_t)iov_a;
    int64_t *got = (int64_t *)(uintptr_t)got_a;
    unsigned char *stage = (unsigned char *)(uintptr_t)stage_a;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const struct iovec *v = iov + firsts[i];
        const int whole = wants[i] <= stage_bytes; /* into stage, then copied out */
        struct iovec one = {stage, (size_t)wants[i]};
        const ssize_t r = whole ? nowait_preadv((int)fds[i], &one, 1, (off_t)offs[i])
                                : nowait_preadv((int)fds[i], v, (int)counts[i], (off_t)offs[i]);
        got[i] = r;
        if (r < 0 && errno == EOPNOTSUPP) { /* a file system without RWF_NOWAIT (tmpfs):
                                              the task's calls to io_uring, none tried */
            for (Py_ssize_t j = i + 1; j < n; j++)
                got[j] = -1;
            break;
        }
        if (!whole || r != wants[i])
            continue;
        const unsigned char *at = stage;
        for (int64_t j = 0; j < counts[i]; j++) {
            copy_out((unsigned char *)v[j].iov_base, at, v[j].iov_len);
            at += v[j].iov_len;
        }
    }
    fence();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}


/* copy_rows_buf(buf, buf_bytes, offsets, sizes, start, n, dst, rows, row_bytes) -> the position
 *               of the first chunk not served (n: all)
 *
 * decode_rows_buf for raw inner chunks (stored without compression: compression auto for
 * values lz4 does not shrink, or none): chunk i is bytes [offsets[i], offsets[i] + sizes[i])
 * of buf, exactly rows * row_bytes of them (else it is not served: Python names it corrupt),
 * wholly inside buf (else truncated); row r of it copied to dst[i * rows + r] (0: nowhere). */
static PyObject *copy_rows_buf(PyObject *self, PyObject *args) {
    unsigned long long buf_a, offs_a, sizes_a, dst_a;
    Py_ssize_t buf_bytes, start, n, rows, row_bytes;
    if (!PyArg_ParseTuple(args, "KnKKnnKnn", &buf_a, &buf_bytes, &offs_a, &sizes_a, &start, &n,
                          &dst_a, &rows, &row_bytes))
        return NULL;
    const unsigned char *buf = (const unsigned char *)(uintptr_t)buf_a;
    const int64_t *offs = (const int64_t *)(uintptr_t)offs_a;
    const int64_t *sizes = (const int64_t *)(uintptr_t)sizes_a;
    unsigned char *const *dst = (unsigned char *const *)(uintptr_t)dst_a;
    const int64_t full = (int64_t)rows * (int64_t)row_bytes;
    Py_ssize_t i = start;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        const int64_t off = offs[i], size = sizes[i];
        if (size != full || off < 0 || size > (int64_t)buf_bytes || off > (int64_t)buf_bytes - size)
            break;
        unsigned char *const *to = dst + i * rows;
        for (Py_ssize_t r = 0; r < rows; r++)
            if (to[r])
                memcpy(to[r], buf + off + r * row_bytes, (size_t)row_bytes);
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromSsize_t(i);
}
