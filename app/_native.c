/*
 * app._native: the per-record loops of the hot paths, in C.
 *
 * Each function here has a Python definition that stays the reference (app/wire/kafka/records/,
 * app/storage/arrays.py); the tests hold the two equal. A function answers None whenever its input
 * is anything but the plain case it was written for (a malformed record, an integer out of range,
 * an unexpected type): the caller then runs the Python definition, which gives the exact answer or
 * the exact error. So nothing here decides what is valid; it only makes the valid case fast.
 *
 *   read_records(buf, pos, count, base_ts, log_append_ts, record_type)
 *       Kafka record batch v2: ``count`` records from ``buf[pos:]``, which they must fill exactly,
 *       as a tuple of ``record_type`` (offset_delta, timestamp_ms, key, value, headers).
 *   encode_records(records, base_offset, base_ts)
 *       The records section of one data batch from stored rows (offset, key, value, header_keys,
 *       header_values, timestamp_ms, ...): (bytes, max timestamp).
 *   batch_run_ends(records)
 *       Where each run of stored rows that can be one batch ends (exclusive indexes).
 *   array(oid, width, items)
 *       A one-dimensional array in PostgreSQL's binary format (array_send), of bytes (or None)
 *       items (width 0), or of integers (or None) of 4 or 8 bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- reading --------------------------------------------------------------------------------- */

/* Kafka's varint (zigzag) at *p, at most ``max_bytes`` long and below ``end``: 0 and the value in
 * *out, or -1 when it is longer, runs past ``end`` or does not fit in ``bits``. */
static int
read_varint(const unsigned char **p, const unsigned char *end, int bits, int64_t *out)
{
    const unsigned char *q = *p;
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (q >= end)
            return -1;
        unsigned char b = *q++;
        if (shift == 63 && (b & 0x7E))
            return -1;
        z |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
        if (shift >= bits)
            return -1;
    }
    if (bits < 64 && (z >> bits))
        return -1;
    *out = (int64_t)((z >> 1) ^ (~(z & 1) + 1));
    *p = q;
    return 0;
}

/* A bytes object of ``n`` bytes at *p (n >= 0), or None for n == -1; NULL with no error set when
 * malformed, NULL with an error set when out of memory. */
static PyObject *
read_bytes(const unsigned char **p, const unsigned char *end, int64_t n)
{
    if (n == -1)
        Py_RETURN_NONE;
    if (n < 0 || n > end - *p)
        return NULL;
    PyObject *b = PyBytes_FromStringAndSize((const char *)*p, (Py_ssize_t)n);
    *p += n;
    return b;
}

static PyObject *
read_headers(const unsigned char **p, const unsigned char *end, int64_t n)
{
    if (n < 0 || n > (end - *p) / 2)
        return NULL;
    PyObject *headers = PyTuple_New((Py_ssize_t)n);
    if (headers == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t len;
        if (read_varint(p, end, 32, &len) < 0 || len < 0 || len > end - *p)
            goto malformed;
        PyObject *key = PyUnicode_DecodeUTF8((const char *)*p, (Py_ssize_t)len, NULL);
        if (key == NULL) {
            PyErr_Clear();  /* not UTF-8: the Python definition names the error */
            goto malformed;
        }
        *p += len;
        PyObject *value = NULL;
        if (read_varint(p, end, 32, &len) < 0 || (value = read_bytes(p, end, len)) == NULL) {
            Py_DECREF(key);
            goto malformed;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto malformed;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyTuple_SET_ITEM(headers, i, pair);
    }
    return headers;
malformed:
    Py_DECREF(headers);
    return NULL;
}

static PyObject *
native_read_records(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, count;
    long long base_ts;
    PyObject *log_append_obj, *record_type;
    if (!PyArg_ParseTuple(args, "y*nnLOO!", &view, &pos, &count, &base_ts, &log_append_obj, &PyType_Type, &record_type))
        return NULL;
    PyTypeObject *rtype = (PyTypeObject *)record_type;
    PyObject *result = NULL, *records = NULL;
    int has_log_append = log_append_obj != Py_None;
    long long log_append_ts = 0;
    if (has_log_append) {
        log_append_ts = PyLong_AsLongLong(log_append_obj);
        if (log_append_ts == -1 && PyErr_Occurred())
            goto fallback;
    }
    if (pos < 0 || pos > view.len || count < 0 || !PyType_IsSubtype(rtype, &PyTuple_Type))
        goto fallback;
    const unsigned char *buf = (const unsigned char *)view.buf;
    const unsigned char *p = buf + pos, *end = buf + view.len;
    if (count > (end - p) / 7)
        goto fallback;
    records = PyTuple_New(count);
    if (records == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, n;
        if (read_varint(&p, end, 32, &length) < 0 || length < 6 || length > end - p)
            goto fallback;
        const unsigned char *record_end = p + length;
        p++;  /* attributes, unused */
        if (read_varint(&p, record_end, 64, &ts_delta) < 0 || read_varint(&p, record_end, 32, &offset_delta) < 0)
            goto fallback;
        long long ts;
        if (has_log_append)
            ts = log_append_ts;
        else if (__builtin_add_overflow(base_ts, (long long)ts_delta, &ts))
            goto fallback;
        PyObject *key = NULL, *value = NULL, *headers = NULL;
        if (read_varint(&p, record_end, 32, &n) < 0 || (key = read_bytes(&p, record_end, n)) == NULL)
            goto record_failed;
        if (read_varint(&p, record_end, 32, &n) < 0 || (value = read_bytes(&p, record_end, n)) == NULL)
            goto record_failed;
        if (read_varint(&p, record_end, 32, &n) < 0)
            goto record_failed;
        headers = n == 0 ? PyTuple_New(0) : read_headers(&p, record_end, n);
        if (headers == NULL || p != record_end)
            goto record_failed;
        PyObject *record = rtype->tp_alloc(rtype, 5);
        PyObject *delta_obj = PyLong_FromLongLong(offset_delta), *ts_obj = PyLong_FromLongLong(ts);
        if (record == NULL || delta_obj == NULL || ts_obj == NULL) {
            Py_XDECREF(record);
            Py_XDECREF(delta_obj);
            Py_XDECREF(ts_obj);
            goto record_failed;
        }
        PyTuple_SET_ITEM(record, 0, delta_obj);
        PyTuple_SET_ITEM(record, 1, ts_obj);
        PyTuple_SET_ITEM(record, 2, key);
        PyTuple_SET_ITEM(record, 3, value);
        PyTuple_SET_ITEM(record, 4, headers);
        PyTuple_SET_ITEM(records, i, record);
        continue;
    record_failed:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        goto fallback;
    }
    if (p != end)
        goto fallback;
    result = records;
    records = NULL;
    goto done;
fallback:
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    if (!PyErr_Occurred()) {
        result = Py_None;
        Py_INCREF(result);
    }
done:
    Py_XDECREF(records);
    PyBuffer_Release(&view);
    return result;
}

/* ---- writing --------------------------------------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Buffer;

static int
buffer_reserve(Buffer *b, Py_ssize_t more)
{
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->size + more)
        capacity *= 2;
    char *data = PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

/* The zigzag varint of ``n`` into ``out`` (at least 10 bytes): its length. */
static int
put_varint(unsigned char *out, int64_t n)
{
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    int i = 0;
    while (z > 0x7F) {
        out[i++] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    out[i++] = (unsigned char)z;
    return i;
}

static int
varint_size(int64_t n)
{
    unsigned char scratch[10];
    return put_varint(scratch, n);
}

/* An optional bytes field: its data and length (-1 for None); -1 when neither bytes nor None. */
static int
bytes_field(PyObject *obj, const char **data, Py_ssize_t *len)
{
    if (obj == Py_None) {
        *data = "";
        *len = -1;
        return 0;
    }
    if (!PyBytes_CheckExact(obj))
        return -1;
    *data = PyBytes_AS_STRING(obj);
    *len = PyBytes_GET_SIZE(obj);
    return 0;
}

#define MAX_HEADERS_ON_STACK 16

static PyObject *
native_encode_records(PyObject *module, PyObject *args)
{
    PyObject *records;
    long long base_offset, base_ts;
    if (!PyArg_ParseTuple(args, "OLL", &records, &base_offset, &base_ts))
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Buffer out = {NULL, 0, 0};
    long long max_ts = base_ts;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *row = items[i];
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) < 6)
            goto fallback;
        int overflow = 0;
        long long offset = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(row, 0), &overflow);
        if (overflow || (offset == -1 && PyErr_Occurred()))
            goto fallback;
        long long ts = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(row, 5), &overflow);
        if (overflow || (ts == -1 && PyErr_Occurred()))
            goto fallback;
        long long ts_delta, offset_delta;
        if (__builtin_sub_overflow(ts, base_ts, &ts_delta) || __builtin_sub_overflow(offset, base_offset, &offset_delta))
            goto fallback;
        if (ts > max_ts)
            max_ts = ts;
        const char *key, *value;
        Py_ssize_t key_len, value_len;
        if (bytes_field(PyTuple_GET_ITEM(row, 1), &key, &key_len) < 0 || bytes_field(PyTuple_GET_ITEM(row, 2), &value, &value_len) < 0)
            goto fallback;
        PyObject *hkeys = PyTuple_GET_ITEM(row, 3), *hvalues = PyTuple_GET_ITEM(row, 4);
        Py_ssize_t nh = 0;
        if (hkeys != Py_None) {
            if (!PyList_CheckExact(hkeys) || !PyList_CheckExact(hvalues) || PyList_GET_SIZE(hkeys) != PyList_GET_SIZE(hvalues))
                goto fallback;
            nh = PyList_GET_SIZE(hkeys);
            if (nh > MAX_HEADERS_ON_STACK)
                goto fallback;
        }
        const char *hk[MAX_HEADERS_ON_STACK], *hv[MAX_HEADERS_ON_STACK];
        Py_ssize_t hk_len[MAX_HEADERS_ON_STACK], hv_len[MAX_HEADERS_ON_STACK];
        int64_t body = 1 + varint_size(ts_delta) + varint_size(offset_delta)
            + varint_size(key_len) + (key_len > 0 ? key_len : 0)
            + varint_size(value_len) + (value_len > 0 ? value_len : 0) + varint_size(nh);
        for (Py_ssize_t h = 0; h < nh; h++) {
            PyObject *k = PyList_GET_ITEM(hkeys, h);
            if (!PyUnicode_CheckExact(k) || (hk[h] = PyUnicode_AsUTF8AndSize(k, &hk_len[h])) == NULL)
                goto fallback;
            if (bytes_field(PyList_GET_ITEM(hvalues, h), &hv[h], &hv_len[h]) < 0)
                goto fallback;
            body += varint_size(hk_len[h]) + hk_len[h] + varint_size(hv_len[h]) + (hv_len[h] > 0 ? hv_len[h] : 0);
        }
        if (body > INT32_MAX || buffer_reserve(&out, 5 + body) < 0)
            goto fallback;
        unsigned char *w = (unsigned char *)out.data + out.size;
        w += put_varint(w, body);
        *w++ = 0;  /* attributes */
        w += put_varint(w, ts_delta);
        w += put_varint(w, offset_delta);
        w += put_varint(w, key_len);
        if (key_len > 0) {
            memcpy(w, key, key_len);
            w += key_len;
        }
        w += put_varint(w, value_len);
        if (value_len > 0) {
            memcpy(w, value, value_len);
            w += value_len;
        }
        w += put_varint(w, nh);
        for (Py_ssize_t h = 0; h < nh; h++) {
            w += put_varint(w, hk_len[h]);
            memcpy(w, hk[h], hk_len[h]);
            w += hk_len[h];
            w += put_varint(w, hv_len[h]);
            if (hv_len[h] > 0) {
                memcpy(w, hv[h], hv_len[h]);
                w += hv_len[h];
            }
        }
        out.size = (char *)w - out.data;
    }
    Py_DECREF(seq);
    PyObject *section = PyBytes_FromStringAndSize(out.data ? out.data : "", out.size);
    PyMem_Free(out.data);
    if (section == NULL)
        return NULL;
    return Py_BuildValue("(NL)", section, max_ts);
fallback:
    Py_DECREF(seq);
    PyMem_Free(out.data);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* The fields of a stored row (app.domain.log.StoredRecord) that cut batch runs. */
enum { ROW_OFFSET = 0, ROW_PRODUCER_ID = 6, ROW_PRODUCER_EPOCH = 7, ROW_SEQUENCE = 8, ROW_TRANSACTIONAL = 9, ROW_CONTROL_TYPE = 10 };

static int
as_int64(PyObject *obj, long long *out)
{
    if (!PyLong_Check(obj))
        return -1;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (*out == -1 && PyErr_Occurred()))
        return -1;
    return 0;
}

/* 1 when ``a != b`` (Python's comparison), 0 when equal, -1 on error. */
static int
differ(PyObject *a, PyObject *b)
{
    return a == b ? 0 : PyObject_RichCompareBool(a, b, Py_NE);
}

static PyObject *
native_batch_run_ends(PyObject *module, PyObject *args)
{
    PyObject *records;
    if (!PyArg_ParseTuple(args, "O", &records))
        return NULL;
    PyObject *seq = PySequence_Fast(records, "records must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **rows = PySequence_Fast_ITEMS(seq);
    PyObject *ends = PyList_New(0);
    if (ends == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyTuple_Check(rows[i]) || PyTuple_GET_SIZE(rows[i]) <= ROW_CONTROL_TYPE)
            goto fallback;
    Py_ssize_t i = 0;
    while (i < n) {
        PyObject *first = rows[i];
        Py_ssize_t j = i + 1;
        if (PyTuple_GET_ITEM(first, ROW_CONTROL_TYPE) == Py_None) {
            PyObject *pid = PyTuple_GET_ITEM(first, ROW_PRODUCER_ID), *epoch = PyTuple_GET_ITEM(first, ROW_PRODUCER_EPOCH);
            PyObject *txn = PyTuple_GET_ITEM(first, ROW_TRANSACTIONAL), *first_seq = PyTuple_GET_ITEM(first, ROW_SEQUENCE);
            long long base, last, seq0 = 0;
            if (as_int64(PyTuple_GET_ITEM(first, ROW_OFFSET), &base) < 0)
                goto fallback;
            if (first_seq != Py_None && as_int64(first_seq, &seq0) < 0)
                goto fallback;
            last = base;
            for (; j < n; j++) {
                PyObject *r = rows[j];
                long long offset;
                if (PyTuple_GET_ITEM(r, ROW_CONTROL_TYPE) != Py_None)
                    break;
                int d;
                if ((d = differ(PyTuple_GET_ITEM(r, ROW_PRODUCER_ID), pid)) != 0
                    || (d = differ(PyTuple_GET_ITEM(r, ROW_PRODUCER_EPOCH), epoch)) != 0
                    || (d = differ(PyTuple_GET_ITEM(r, ROW_TRANSACTIONAL), txn)) != 0) {
                    if (d < 0)
                        goto fallback;
                    break;
                }
                if (as_int64(PyTuple_GET_ITEM(r, ROW_OFFSET), &offset) < 0)
                    goto fallback;
                if (offset <= last || offset - base > INT32_MAX)  /* offset > last >= base: no overflow */
                    break;
                PyObject *r_seq = PyTuple_GET_ITEM(r, ROW_SEQUENCE);
                if (first_seq == Py_None) {
                    if (r_seq != Py_None)
                        break;
                } else {
                    long long s, want;
                    if (r_seq == Py_None)
                        break;
                    if (as_int64(r_seq, &s) < 0 || __builtin_add_overflow(seq0, offset - base, &want))
                        goto fallback;
                    want %= (long long)INT32_MAX + 1;
                    if (want < 0)
                        want += (long long)INT32_MAX + 1;
                    if (s != want)
                        break;
                }
                last = offset;
            }
        }
        PyObject *end = PyLong_FromSsize_t(j);
        if (end == NULL || PyList_Append(ends, end) < 0) {
            Py_XDECREF(end);
            goto fallback;
        }
        Py_DECREF(end);
        i = j;
    }
    Py_DECREF(seq);
    return ends;
fallback:
    Py_DECREF(seq);
    Py_DECREF(ends);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

/* ---- PostgreSQL's binary arrays -------------------------------------------------------------- */

static void
put_int32(unsigned char *w, int32_t v)
{
    uint32_t u = (uint32_t)v;
    w[0] = (unsigned char)(u >> 24);
    w[1] = (unsigned char)(u >> 16);
    w[2] = (unsigned char)(u >> 8);
    w[3] = (unsigned char)u;
}

static void
put_int64(unsigned char *w, int64_t v)
{
    put_int32(w, (int32_t)((uint64_t)v >> 32));
    put_int32(w + 4, (int32_t)(uint64_t)v);
}

/* The array's header into ``w``: 20 bytes, or 12 for an empty array. */
static Py_ssize_t
put_array_header(unsigned char *w, int32_t oid, Py_ssize_t n, int has_nulls)
{
    if (n == 0) {
        put_int32(w, 0);
        put_int32(w + 4, 0);
        put_int32(w + 8, oid);
        return 12;
    }
    put_int32(w, 1);
    put_int32(w + 4, has_nulls);
    put_int32(w + 8, oid);
    put_int32(w + 12, (int32_t)n);
    put_int32(w + 16, 1);
    return 20;
}

/* The 8-byte length-and-value of an integer item, or of a bytes item (``width`` 0); -1 (out of
 * range, another type) leaves the array to the Python definition. */
static Py_ssize_t
item_size(PyObject *item, int width)
{
    if (item == Py_None)
        return 4;
    if (width == 0)
        return PyBytes_CheckExact(item) && PyBytes_GET_SIZE(item) <= INT32_MAX ? 4 + PyBytes_GET_SIZE(item) : -1;
    if (!PyLong_CheckExact(item) && !PyBool_Check(item))
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred()) || (width == 4 && (v < INT32_MIN || v > INT32_MAX))) {
        PyErr_Clear();
        return -1;
    }
    return 4 + width;
}

static PyObject *
native_array(PyObject *module, PyObject *args)
{
    int oid, width;
    PyObject *items;
    if (!PyArg_ParseTuple(args, "iiO", &oid, &width, &items))
        return NULL;
    if (width != 0 && width != 4 && width != 8)
        Py_RETURN_NONE;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **it = PySequence_Fast_ITEMS(seq);
    Py_ssize_t size = 20;
    int has_nulls = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t item = item_size(it[i], width);
        if (item < 0 || n > INT32_MAX) {
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        has_nulls |= it[i] == Py_None;
        size += item;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n ? size : 12);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    w += put_array_header(w, oid, n, has_nulls);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = it[i];
        if (item == Py_None) {
            put_int32(w, -1);
            w += 4;
        } else if (width == 0) {
            Py_ssize_t len = PyBytes_GET_SIZE(item);
            put_int32(w, (int32_t)len);
            memcpy(w + 4, PyBytes_AS_STRING(item), len);
            w += 4 + len;
        } else {
            long long v = PyLong_AsLongLong(item);  /* in range: checked above */
            put_int32(w, width);
            if (width == 4)
                put_int32(w + 4, (int32_t)v);
            else
                put_int64(w + 4, (int64_t)v);
            w += 4 + width;
        }
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef native_methods[] = {
    {"read_records", native_read_records, METH_VARARGS, "The records of a batch v2, or None to leave it to the Python definition."},
    {"encode_records", native_encode_records, METH_VARARGS, "A data batch's records section and max timestamp, or None."},
    {"batch_run_ends", native_batch_run_ends, METH_VARARGS, "Where each batch run of stored rows ends, or None."},
    {"array", native_array, METH_VARARGS, "A binary array of bytes (width 0), int4 or int8 items, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "app._native", "The hot paths' per-record loops in C.", -1, native_methods,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&native_module);
}
