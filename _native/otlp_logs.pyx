# cython: language_level=3
"""OTLP ExportLogsServiceRequest (protobuf wire bytes) → plain Python values, read directly
off the wire bytes: the control plane's ingest hot path (the protobuf classes' accessors
cost ~2 µs per attribute in Python; this costs a fraction).

Same API and results as `otlp_logs_ref` for every value it handles; an array or map value
(which the agent never sends) raises NotImplementedError so the caller uses the twin for that
request. Malformed bytes raise ValueError; fields it does not read (unknown ones, and known
ones denpex has no use for: scopes, trace ids, newer schema additions) are skipped by their
wire type without looking inside, as protobuf does for unknown fields.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy


cdef inline uint64_t _varint(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef unsigned char b
    while True:
        if pos[0] >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos[0]]
        pos[0] += 1
        result |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            return result
        shift += 7


cdef inline uint64_t _fixed64(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t value = 0
    if pos[0] + 8 > end:
        raise ValueError("truncated fixed64")
    memcpy(&value, buf + pos[0], 8)  # little-endian on every platform denpex builds for
    pos[0] += 8
    return value


cdef inline Py_ssize_t _length(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end) except -1:
    cdef uint64_t n = _varint(buf, pos, end)
    if n > <uint64_t>(end - pos[0]):
        raise ValueError("length past the end of its message")
    return <Py_ssize_t>n


cdef inline int _skip(const unsigned char* buf, Py_ssize_t* pos, Py_ssize_t end, int wire) except -1:
    # (an unknown field: skipped by its wire type, as protobuf keeps and ignores it)
    if wire == 0:
        _varint(buf, pos, end)
    elif wire == 1:
        if pos[0] + 8 > end:
            raise ValueError("truncated fixed64")
        pos[0] += 8
    elif wire == 2:
        pos[0] += _length(buf, pos, end)
    elif wire == 5:
        if pos[0] + 4 > end:
            raise ValueError("truncated fixed32")
        pos[0] += 4
    else:
        raise ValueError(f"unsupported wire type {wire}")
    return 0


cdef inline str _string(const unsigned char* buf, Py_ssize_t start, Py_ssize_t n):
    return PyUnicode_DecodeUTF8(<const char*>(buf + start), n, "strict")


cdef int _any_value(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, list out) except -1:
    """Set out[0] to the AnyValue in buf[pos:end] when it has a member (the last one wins)."""
    cdef uint64_t key, raw
    cdef int field, wire
    cdef Py_ssize_t n
    cdef double d
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 1 and wire == 2:
            n = _length(buf, &pos, end)
            out[0] = _string(buf, pos, n)
            pos += n
        elif field == 2 and wire == 0:
            out[0] = _varint(buf, &pos, end) != 0
        elif field == 3 and wire == 0:
            raw = _varint(buf, &pos, end)
            out[0] = <int64_t>raw
        elif field == 4 and wire == 1:
            raw = _fixed64(buf, &pos, end)
            memcpy(&d, &raw, 8)
            out[0] = d
        elif field == 7 and wire == 2:
            n = _length(buf, &pos, end)
            out[0] = (<bytes>buf[pos:pos + n]).hex()
            pos += n
        elif (field == 5 or field == 6) and wire == 2:
            raise NotImplementedError("array or map value")
        else:
            _skip(buf, &pos, end, wire)
    return 0


cdef int _key_value(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, dict into) except -1:
    cdef uint64_t key
    cdef int field, wire
    cdef Py_ssize_t n
    cdef str name = ""
    cdef list value = [None]
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 1 and wire == 2:
            n = _length(buf, &pos, end)
            name = _string(buf, pos, n)
            pos += n
        elif field == 2 and wire == 2:
            n = _length(buf, &pos, end)
            _any_value(buf, pos, pos + n, value)
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    into[name] = value[0]
    return 0


cdef int _attributes_of(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, int attr_field, dict into) except -1:
    """The KeyValues of field `attr_field` in the message buf[pos:end], into `into`."""
    cdef uint64_t key
    cdef int field, wire
    cdef Py_ssize_t n
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == attr_field and wire == 2:
            n = _length(buf, &pos, end)
            _key_value(buf, pos, pos + n, into)
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    return 0


cdef tuple _log_record(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end):
    cdef uint64_t key, raw
    cdef int field, wire
    cdef Py_ssize_t n
    cdef uint64_t time_ns = 0
    cdef int64_t severity = 0
    cdef str severity_text = ""
    cdef list body = [None]
    cdef dict attrs = {}
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 1 and wire == 1:
            time_ns = _fixed64(buf, &pos, end)
        elif field == 2 and wire == 0:
            raw = _varint(buf, &pos, end)
            severity = <int>(<uint32_t>raw)  # an int32 enum: the low 32 bits, signed
        elif field == 3 and wire == 2:
            n = _length(buf, &pos, end)
            severity_text = _string(buf, pos, n)
            pos += n
        elif field == 5 and wire == 2:
            n = _length(buf, &pos, end)
            _any_value(buf, pos, pos + n, body)
            pos += n
        elif field == 6 and wire == 2:
            n = _length(buf, &pos, end)
            _key_value(buf, pos, pos + n, attrs)
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    return (time_ns, severity, severity_text, body[0], attrs)


cdef int _scope_logs(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end, list records) except -1:
    cdef uint64_t key
    cdef int field, wire
    cdef Py_ssize_t n
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 2 and wire == 2:
            n = _length(buf, &pos, end)
            records.append(_log_record(buf, pos, pos + n))
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    return 0


cdef tuple _resource_logs(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t end):
    cdef uint64_t key
    cdef int field, wire
    cdef Py_ssize_t n
    cdef dict resource = {}
    cdef list records = []
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 1 and wire == 2:
            n = _length(buf, &pos, end)
            _attributes_of(buf, pos, pos + n, 1, resource)  # Resource.attributes
            pos += n
        elif field == 2 and wire == 2:
            n = _length(buf, &pos, end)
            _scope_logs(buf, pos, pos + n, records)
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    return (resource, records)


def decode_logs_request(bytes data):
    """[(resource attributes, [(time_unix_nano, severity_number, severity_text, body,
    attributes), ...]), ...] of an ExportLogsServiceRequest; ValueError for bad bytes."""
    cdef const unsigned char* buf = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t n
    cdef uint64_t key
    cdef int field, wire
    cdef list out = []
    while pos < end:
        key = _varint(buf, &pos, end)
        field = <int>(key >> 3)
        wire = <int>(key & 7)
        if field == 0:
            raise ValueError("field number 0")
        if field == 1 and wire == 2:
            n = _length(buf, &pos, end)
            out.append(_resource_logs(buf, pos, pos + n))
            pos += n
        else:
            _skip(buf, &pos, end, wire)
    return out
