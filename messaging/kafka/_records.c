/*
 * messaging.kafka._records: Kafka's v2 records and the broker's frames, one pass in C each way.
 *
 * A Kafka record becomes one frame per record and every stored frame one record; in Python
 * that is an object or two and a checksum call per record, which made a Kafka record cost
 * the broker more than an HTTP frame does (see bench/kafka). Here both directions walk the
 * bytes once to size the output, then write it, with the GIL released throughout.
 *
 * Frame (see messaging/frames.py; big-endian): index u64 | crc u32 | type u16 | topic u64 |
 * length u32 | data, the CRC-32C covering type to the end of data.
 *
 * Kafka record (inside a v2 batch): length varint | attributes int8 | timestamp delta varlong
 * | offset delta varint | key length varint (-1: null) | key | value length varint | value |
 * header count varint | per header: name length varint | name (UTF-8) | value length varint
 * (-1: null) | value. Varints are zig-zag.
 *
 * A record with no key, no headers and a value is stored as a plain frame (type 1) of the
 * value; any other as a frame of type 0x4B01 holding an envelope: a version byte (1), then the
 * record's bytes from its key length on, which is exactly the envelope layout records.py
 * documents and decodes (open_envelope).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_HEADER 26
#define CRC_AT 8
#define TYPE_AT 12
#define TOPIC_AT 14
#define LENGTH_AT 22
#define PLAIN_TYPE 1
#define KAFKA_RECORD_TYPE 0x4B01
#define ENVELOPE_VERSION 1
#define MAX_OFFSET_DELTA 0x7FFFFFFFLL
#define BATCH_HEADER 61
/* The smallest record: length, attributes, timestamp and offset deltas, key and value
 * lengths and header count, a byte each. */
#define MIN_RECORD 7
#define BATCH_CRC_AT 17
#define BATCH_ATTRIBUTES_AT 21
/* A frame's data length is at most 2^30 (frames.HARD_MAX_MESSAGE_SIZE). */
#define MAX_DATA (1LL << 30)
/* Records of one fetched batch stop before the batch would pass an int32's size. */
#define MAX_BATCH 0x7FFFFFFFLL

/* -- CRC-32C (Castagnoli): SSE 4.2 where the CPU has it, slicing by 8 elsewhere ---------- */

static uint32_t crc_table[8][256];

static void
crc_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

static uint32_t
crc_soft(uint32_t crc, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        uint32_t lo = crc ^ (uint32_t)w, hi = (uint32_t)(w >> 32);
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
              crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
              crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
              crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_CRC_HARD 1

__attribute__((target("sse4.2"))) static uint32_t
crc_hard(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8;
        n -= 8;
    }
    crc = (uint32_t)c;
    while (n--)
        crc = _mm_crc32_u8(crc, *p++);
    return crc;
}
#endif

static uint32_t (*crc_update)(uint32_t, const uint8_t *, size_t) = crc_soft;

static uint32_t
crc32c(const uint8_t *p, size_t n)
{
    return ~crc_update(0xFFFFFFFFu, p, n);
}

/* -- fixed-width big-endian fields and zig-zag varints ---------------------------------- */

static inline void
put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static inline void
put32(uint8_t *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static inline void
put64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static inline uint64_t
get_be(const uint8_t *p, int size)
{
    uint64_t v = 0;
    for (int i = 0; i < size; i++)
        v = (v << 8) | p[i];
    return v;
}

/* The i-th native int64 of a buffer that need not be aligned. */
static inline int64_t
native64(const uint8_t *p, Py_ssize_t i)
{
    int64_t v;
    memcpy(&v, p + i * (Py_ssize_t)sizeof(v), sizeof(v));
    return v;
}

/* The zig-zag varint at *pos (before end) into *out: a varlong of at most 10 bytes when
 * `wide`, else a varint of an int32, at most 5 bytes (Java's Kafka refuses longer ones); 0,
 * or -1 when it is cut off, too long or out of range. */
static inline int
read_varint(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, int64_t *out, int wide)
{
    uint64_t raw = 0;
    Py_ssize_t at = *pos;
    int limit = wide ? 63 : 28;
    for (int shift = 0;; shift += 7) {
        if (at >= end || shift > limit)
            return -1;
        uint8_t b = buf[at++];
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80))
            break;
    }
    if (!wide && raw > 0xFFFFFFFFu)
        return -1;
    *pos = at;
    *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
    return 0;
}

static inline uint64_t
zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

static inline Py_ssize_t
varint_size(int64_t v)
{
    uint64_t z = zigzag(v);
    Py_ssize_t n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *
put_varint(uint8_t *out, int64_t v)
{
    uint64_t z = zigzag(v);
    while (z >= 0x80) {
        *out++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *out++ = (uint8_t)z;
    return out;
}

/* Whether p[0:n] is UTF-8 as Python's strict codec takes it (no overlong forms, surrogates
 * or code points above U+10FFFF): a header name must be. */
static int
utf8_ok(const uint8_t *p, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int more;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        }
        else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        else
            return 0;
        if (n - i <= more)
            return 0;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return 0;
        for (int k = 2; k <= more; k++)
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
        i += more + 1;
    }
    return 1;
}

/* A length and the bytes it counts, at *pos before end: 0, or -1 when malformed. A negative
 * length is null (as Kafka reads one), which only a nullable field may be. */
static inline int
skip_bytes(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, int nullable, int64_t *length)
{
    if (read_varint(buf, end, pos, length, 0) < 0)
        return -1;
    if (*length < 0)
        return nullable ? 0 : -1;
    if (*length > end - *pos)
        return -1;
    *pos += (Py_ssize_t)*length;
    return 0;
}

/* Headers from *pos: count, then names (UTF-8) and nullable values; 0, or -1 when
 * malformed. */
static int
skip_headers(const uint8_t *buf, Py_ssize_t end, Py_ssize_t *pos, int64_t *count)
{
    int64_t length;
    if (read_varint(buf, end, pos, count, 0) < 0 || *count < 0)
        return -1;
    for (int64_t h = 0; h < *count; h++) {
        if (skip_bytes(buf, end, pos, 0, &length) < 0)
            return -1;
        if (!utf8_ok(buf + *pos - length, (Py_ssize_t)length))
            return -1;
        if (skip_bytes(buf, end, pos, 1, &length) < 0)
            return -1;
    }
    return 0;
}

/* Whether a stored message's data is an envelope records.open_envelope would open. */
static int
envelope_ok(const uint8_t *data, Py_ssize_t n)
{
    Py_ssize_t pos = 1;
    int64_t length, count;
    if (n < 1 || data[0] != ENVELOPE_VERSION)
        return 0;
    if (skip_bytes(data, n, &pos, 1, &length) < 0 || skip_bytes(data, n, &pos, 1, &length) < 0)
        return 0;
    if (skip_headers(data, n, &pos, &count) < 0)
        return 0;
    return pos == n;
}

/* -- records -> frames ------------------------------------------------------------------ */

typedef struct {
    Py_ssize_t at;     /* where the stored bytes start in the records */
    Py_ssize_t length; /* the frame's data length */
    int plain;
} Span;

/* Why records cannot be stored (set without the GIL, raised with it). */
typedef struct {
    const char *what;
    Py_ssize_t record;
} Fault;

static Py_ssize_t
scan_records(const uint8_t *buf, Py_ssize_t end, Py_ssize_t count, Span *spans, Fault *fault,
             Py_ssize_t *largest, int *all_plain)
{
    Py_ssize_t pos = 0, total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, skipped, key, value, headers;
        fault->record = i;
        if (read_varint(buf, end, &pos, &length, 0) < 0) {
            fault->what = "its length is cut off";
            return -1;
        }
        if (length < 1 || length > end - pos) {
            fault->what = "its length runs past the records' end";
            return -1;
        }
        Py_ssize_t record_end = pos + (Py_ssize_t)length;
        pos++; /* attributes */
        if (read_varint(buf, record_end, &pos, &skipped, 1) < 0 ||
            read_varint(buf, record_end, &pos, &skipped, 0) < 0) {
            fault->what = "its timestamp or offset delta is cut off";
            return -1;
        }
        Py_ssize_t key_at = pos;
        if (skip_bytes(buf, record_end, &pos, 1, &key) < 0) {
            fault->what = "its key runs past its end";
            return -1;
        }
        if (skip_bytes(buf, record_end, &pos, 1, &value) < 0) {
            fault->what = "its value runs past its end";
            return -1;
        }
        Py_ssize_t value_at = pos - (value > 0 ? (Py_ssize_t)value : 0);
        if (skip_headers(buf, record_end, &pos, &headers) < 0) {
            fault->what = "its headers are malformed (or a name is not UTF-8)";
            return -1;
        }
        if (pos != record_end) {
            fault->what = "its fields do not fill its length";
            return -1;
        }
        Span *span = &spans[i];
        if (key < 0 && headers == 0 && value >= 0) {
            span->at = value_at;
            span->length = (Py_ssize_t)value;
            span->plain = 1;
        }
        else {
            span->at = key_at;
            span->length = 1 + record_end - key_at;
            span->plain = 0;
            *all_plain = 0;
        }
        if (span->length > MAX_DATA) {
            fault->what = "it is larger than any frame can hold";
            return -1;
        }
        if (span->length > *largest)
            *largest = span->length;
        total += FRAME_HEADER + span->length;
    }
    if (pos != end) {
        fault->record = count;
        fault->what = "bytes follow the last record";
        return -1;
    }
    return total;
}

static void
write_frames(const uint8_t *buf, const Span *spans, Py_ssize_t count, uint64_t topic,
             uint8_t *out, int64_t *offsets)
{
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Span *span = &spans[i];
        uint8_t *frame = out + at;
        uint8_t *data = frame + FRAME_HEADER;
        offsets[i] = at;
        put64(frame, 0);
        put16(frame + TYPE_AT, span->plain ? PLAIN_TYPE : KAFKA_RECORD_TYPE);
        put64(frame + TOPIC_AT, topic);
        put32(frame + LENGTH_AT, (uint32_t)span->length);
        if (span->plain)
            memcpy(data, buf + span->at, span->length);
        else {
            data[0] = ENVELOPE_VERSION;
            memcpy(data + 1, buf + span->at, span->length - 1);
        }
        put32(frame + CRC_AT, crc32c(frame + TYPE_AT, FRAME_HEADER - TYPE_AT + span->length));
        at += FRAME_HEADER + span->length;
    }
}

PyDoc_STRVAR(frames_of_records_doc,
"frames_of_records(records, count, topic) -> (body, offsets, stride, largest, plain)\n\n"
"The publish frames of a v2 batch's ``count`` records (uncompressed, after the batch\n"
"header) for ``topic``: the frames, each frame's start as native int64s (for\n"
"``array('q')``), the frame size when all are one size (else 0), the largest data length,\n"
"and whether every record was plain. ValueError names the first record that is malformed.");

static PyObject *
frames_of_records(PyObject *self, PyObject *args)
{
    Py_buffer in;
    Py_ssize_t count;
    unsigned long long topic;
    if (!PyArg_ParseTuple(args, "y*nK", &in, &count, &topic))
        return NULL;
    const uint8_t *buf = in.buf;
    Py_ssize_t end = in.len;
    if (count < 0 || count > end / MIN_RECORD) {
        PyBuffer_Release(&in);
        return PyErr_Format(PyExc_ValueError, "%zd records cannot fit in %zd bytes", count,
                            end);
    }
    Span *spans = PyMem_RawMalloc(sizeof(Span) * (size_t)(count ? count : 1));
    if (spans == NULL) {
        PyBuffer_Release(&in);
        return PyErr_NoMemory();
    }
    Fault fault = {NULL, 0};
    Py_ssize_t largest = 0, total;
    int all_plain = 1;
    Py_BEGIN_ALLOW_THREADS
    total = scan_records(buf, end, count, spans, &fault, &largest, &all_plain);
    Py_END_ALLOW_THREADS
    PyObject *body = NULL, *offsets = NULL;
    if (total < 0) {
        PyErr_Format(PyExc_ValueError, "record %zd: %s", fault.record, fault.what);
        goto done;
    }
    body = PyBytes_FromStringAndSize(NULL, total);
    offsets = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(int64_t));
    if (body == NULL || offsets == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(body);
    int64_t *starts = (int64_t *)PyBytes_AS_STRING(offsets);
    Py_BEGIN_ALLOW_THREADS
    write_frames(buf, spans, count, (uint64_t)topic, out, starts);
    Py_END_ALLOW_THREADS
    Py_ssize_t stride = count ? FRAME_HEADER + spans[0].length : 0;
    for (Py_ssize_t i = 1; i < count && stride; i++)
        if (FRAME_HEADER + spans[i].length != stride)
            stride = 0;
    PyMem_RawFree(spans);
    PyBuffer_Release(&in);
    return Py_BuildValue("(NNnnO)", body, offsets, stride, largest,
                         all_plain ? Py_True : Py_False);
done:
    Py_XDECREF(body);
    Py_XDECREF(offsets);
    PyMem_RawFree(spans);
    PyBuffer_Release(&in);
    return NULL;
}

/* -- frames -> one record batch --------------------------------------------------------- */

typedef struct {
    Py_ssize_t data;   /* where the frame's data starts */
    Py_ssize_t length; /* its length */
    int64_t delta;     /* offset delta */
    int64_t stamp;     /* timestamp (-1: unknown) */
    int envelope;
} Entry;

static Py_ssize_t
entry_size(const Entry *e, int64_t base_stamp)
{
    Py_ssize_t body = e->envelope ? e->length - 1
                                  : 1 + varint_size(e->length) + e->length + 1;
    Py_ssize_t inner = 1 + varint_size(e->stamp - base_stamp) + varint_size(e->delta) + body;
    return varint_size(inner) + inner;
}

PyDoc_STRVAR(batch_of_frames_doc,
"batch_of_frames(frames, firsts, stamps) -> (batch, count)\n\n"
"One uncompressed v2 record batch of whole, verified frames of one topic, in index order:\n"
"its base offset is the first frame's index, each record's offset its frame's index and its\n"
"timestamp its run's stamp (``firsts`` and ``stamps``: native int64 buffers of (first index,\n"
"time) runs, -1 where unknown). ``count``: how many frames it holds, those within an int32\n"
"offset delta of the first (the rest go in the next batch). Empty frames: (b'', 0).");

static PyObject *
batch_of_frames(PyObject *self, PyObject *args)
{
    Py_buffer in, firsts_buf, stamps_buf;
    if (!PyArg_ParseTuple(args, "y*y*y*", &in, &firsts_buf, &stamps_buf))
        return NULL;
    const uint8_t *buf = in.buf;
    Py_ssize_t end = in.len;
    Py_ssize_t runs = firsts_buf.len / (Py_ssize_t)sizeof(int64_t);
    const uint8_t *firsts = firsts_buf.buf, *stamps = stamps_buf.buf;
    PyObject *result = NULL;
    Entry *entries = NULL;
    if (runs < 1 || stamps_buf.len != firsts_buf.len ||
        firsts_buf.len % (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "one stamp per run, and at least one run (int64s)");
        goto done;
    }
    entries = PyMem_RawMalloc(sizeof(Entry) * (size_t)(end / FRAME_HEADER + 1));
    if (entries == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = 0, total = BATCH_HEADER, at = 0, run = 0;
    int64_t base = 0, base_stamp = -1, max_stamp = -1;
    int cut = 0;
    Py_BEGIN_ALLOW_THREADS
    while (end - at >= FRAME_HEADER) {
        const uint8_t *frame = buf + at;
        int64_t index = (int64_t)get_be(frame, 8);
        uint16_t type = (uint16_t)get_be(frame + TYPE_AT, 2);
        Py_ssize_t length = (Py_ssize_t)get_be(frame + LENGTH_AT, 4);
        if (length > end - at - FRAME_HEADER) {
            cut = 1;
            break;
        }
        if (count == 0)
            base = index;
        else if (index - base > MAX_OFFSET_DELTA)
            break;
        while (run + 1 < runs && index >= native64(firsts, run + 1))
            run++;
        Entry *e = &entries[count];
        e->data = at + FRAME_HEADER;
        e->length = length;
        e->delta = index - base;
        e->stamp = native64(stamps, run);
        e->envelope = type == KAFKA_RECORD_TYPE && envelope_ok(buf + e->data, length);
        if (count == 0)
            base_stamp = max_stamp = e->stamp;
        else if (e->stamp > max_stamp)
            max_stamp = e->stamp;
        Py_ssize_t size = entry_size(e, base_stamp);
        if (total + size > MAX_BATCH)
            break;
        total += size;
        count++;
        at += FRAME_HEADER + length;
    }
    Py_END_ALLOW_THREADS
    if (cut) {
        PyErr_Format(PyExc_ValueError, "a frame at byte %zd runs past the end", at);
        goto done;
    }
    if (count == 0) {
        result = Py_BuildValue("(yn)", "", (Py_ssize_t)0);
        goto done;
    }
    PyObject *batch = PyBytes_FromStringAndSize(NULL, total);
    if (batch == NULL)
        goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(batch);
    Py_BEGIN_ALLOW_THREADS
    put64(out, (uint64_t)base);
    put32(out + 8, (uint32_t)(total - 12));
    put32(out + 12, 0xFFFFFFFFu); /* partition leader epoch: none */
    out[16] = 2;                  /* magic */
    put16(out + BATCH_ATTRIBUTES_AT, 0);
    put32(out + 23, (uint32_t)entries[count - 1].delta);
    put64(out + 27, (uint64_t)base_stamp);
    put64(out + 35, (uint64_t)max_stamp);
    put64(out + 43, UINT64_MAX); /* producer id: none */
    put16(out + 51, 0xFFFF);     /* producer epoch */
    put32(out + 53, 0xFFFFFFFFu); /* base sequence */
    put32(out + 57, (uint32_t)count);
    uint8_t *w = out + BATCH_HEADER;
    for (Py_ssize_t i = 0; i < count; i++) {
        const Entry *e = &entries[i];
        Py_ssize_t body = e->envelope ? e->length - 1
                                      : 1 + varint_size(e->length) + e->length + 1;
        int64_t stamp_delta = e->stamp - base_stamp;
        Py_ssize_t inner = 1 + varint_size(stamp_delta) + varint_size(e->delta) + body;
        w = put_varint(w, inner);
        *w++ = 0; /* attributes */
        w = put_varint(w, stamp_delta);
        w = put_varint(w, e->delta);
        if (e->envelope) {
            memcpy(w, buf + e->data + 1, e->length - 1);
            w += e->length - 1;
        }
        else {
            w = put_varint(w, -1); /* no key */
            w = put_varint(w, e->length);
            memcpy(w, buf + e->data, e->length);
            w += e->length;
            *w++ = 0; /* no headers */
        }
    }
    put32(out + BATCH_CRC_AT,
          crc32c(out + BATCH_ATTRIBUTES_AT, (size_t)(total - BATCH_ATTRIBUTES_AT)));
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(Nn)", batch, count);
done:
    PyMem_RawFree(entries);
    PyBuffer_Release(&in);
    PyBuffer_Release(&firsts_buf);
    PyBuffer_Release(&stamps_buf);
    return result;
}

PyDoc_STRVAR(index_range_doc,
"index_range(frames) -> (first, last)\n\n"
"The indexes of the first and the last of whole frames ((-1, -1) when there are none).");

static PyObject *
index_range(PyObject *self, PyObject *args)
{
    Py_buffer in;
    if (!PyArg_ParseTuple(args, "y*", &in))
        return NULL;
    const uint8_t *buf = in.buf;
    Py_ssize_t at = 0, end = in.len;
    long long first = -1, last = -1;
    while (end - at >= FRAME_HEADER) {
        last = (long long)get_be(buf + at, 8);
        if (first < 0)
            first = last;
        at += FRAME_HEADER + (Py_ssize_t)get_be(buf + at + LENGTH_AT, 4);
    }
    PyBuffer_Release(&in);
    return Py_BuildValue("(LL)", first, last);
}

PyDoc_STRVAR(checksum_doc,
"crc32c(data, portable=False) -> int\n\nCRC-32C of ``data`` as the frames and batches here\n"
"compute it (``portable``: with the table code machines without SSE 4.2 use).");

static PyObject *
checksum(PyObject *self, PyObject *args)
{
    Py_buffer in;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &in, &portable))
        return NULL;
    uint32_t crc = portable ? ~crc_soft(0xFFFFFFFFu, in.buf, (size_t)in.len)
                            : crc32c(in.buf, (size_t)in.len);
    PyBuffer_Release(&in);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"frames_of_records", frames_of_records, METH_VARARGS, frames_of_records_doc},
    {"batch_of_frames", batch_of_frames, METH_VARARGS, batch_of_frames_doc},
    {"index_range", index_range, METH_VARARGS, index_range_doc},
    {"crc32c", checksum, METH_VARARGS, checksum_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "messaging.kafka._records",
    "Kafka's v2 records and the broker's frames, one pass in C each way.", -1, methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    crc_tables();
#ifdef HAVE_CRC_HARD
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc_update = crc_hard;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "PLAIN_TYPE", PLAIN_TYPE) < 0 ||
        PyModule_AddIntConstant(m, "KAFKA_RECORD_TYPE", KAFKA_RECORD_TYPE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_OFFSET_DELTA", (long)MAX_OFFSET_DELTA) < 0 ||
        PyModule_AddIntConstant(m, "HARDWARE_CRC", crc_update != crc_soft) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
