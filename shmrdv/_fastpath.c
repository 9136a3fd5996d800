/* shmrdv._fastpath: the per-message hot paths of send and recv, and the
 * making of every received view, in C against CPython and numpy.
 *
 * Why: a 64 B send plus a recv and its drop cost ~9 us through cffi and
 * Python glue, of which the core's own work is under 2 us; here they are
 * one call each. Nothing here decides anything the Python layer does not:
 * each function either finishes the common case exactly as the Python code
 * would, or returns None (an int, for a call into the core that did not
 * succeed) and leaves the state as it found it, for the Python code to go
 * on from (waiting in line, parsing a new descriptor, raising an error).
 *
 * The core is not linked in a second time: init() takes the addresses of
 * its functions from the cffi module (shmrdv._native), so there is one
 * core, one process table entry and one SIGBUS table per process. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <structmember.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "shmrdv.h"

/* Sends of at most this many bytes keep the GIL through the core's call:
 * their copy (a few us at most) holds other threads up for less time than
 * releasing and retaking the GIL costs the sender. Larger ones release it. */
#define GIL_HELD_BYTES (64u << 10)

/* A send_many whose messages hold at most this many bytes in all keeps the
 * GIL through the core's call, as a small send does; larger ones go the
 * Python way, whose cffi call releases it. */
#define MANY_GIL_HELD_BYTES (1u << 20)

static __typeof__(rdv_send) *core_send;
static __typeof__(rdv_send_many) *core_send_many;
static __typeof__(rdv_recv_start) *core_recv_start;
static __typeof__(rdv_recv_wait) *core_recv_wait;
static __typeof__(rdv_release_payload) *core_release;
static __typeof__(rdv_send_begin) *core_send_begin;
static __typeof__(rdv_unref) *core_unref;
static __typeof__(rdv_send_discard) *core_send_discard;

/* ---- Payload: the owner of one received message's block ------------------ */

/* The base object of a received view: dropping the last view (or anything
 * derived from it) releases the block, as rdv_release_payload says. It has
 * no buffer interface, so numpy cannot turn a read-only view writable. */
typedef struct {
    PyObject_HEAD
    rdv_t *h;
    void *payload; /* NULL once released or disarmed (_disarm) */
} Payload;

static void payload_dealloc(Payload *self) {
    void *payload = self->payload;
    self->payload = NULL;
    if (payload) {
        /* With the GIL held, as a small send keeps it: a release is short
         * (no copy under any lock; its space freed, a waiter for room
         * woken), and releasing the GIL costs as much, or, when another
         * thread is running Python, a wait for that thread's switch
         * interval to get it back. */
        core_release(self->h, payload);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* _disarm(): the block's address, no longer released when the views go
 * (an interrupted recv_many gives it back to its key instead). */
static PyObject *payload_disarm(Payload *self, PyObject *unused) {
    (void)unused;
    void *payload = self->payload;
    self->payload = NULL;
    return PyLong_FromVoidPtr(payload);
}

static PyMethodDef payload_methods[] = {
    {"_disarm", (PyCFunction)payload_disarm, METH_NOARGS, "The block's address; dropping the views no longer frees it."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PayloadType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmrdv._fastpath.Payload",
    .tp_basicsize = sizeof(Payload),
    .tp_dealloc = (destructor)payload_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The shared-memory block of a received message: released when the last view of it goes.",
    .tp_methods = payload_methods,
};

/* The dims of a shape tuple (at most RDV_NDIM_MAX, checked by the caller):
 * 0, or -1 with an exception. */
static int shape_dims(PyObject *shape, npy_intp *dims) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(shape); i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, i));
        if (dims[i] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* An array of dtype, nd dims at data (flags: NPY_ARRAY_CARRAY or _RO),
 * whose base is owner: the array, or NULL with an exception. owner is
 * taken either way (released when the array cannot be made). */
static PyObject *array_over(PyObject *dtype, int nd, npy_intp *dims, void *data, int flags, PyObject *owner) {
    Py_INCREF(dtype); /* PyArray_NewFromDescr steals it */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, (PyArray_Descr *)dtype, nd, dims, NULL, data, flags, NULL);
    if (!arr) {
        Py_DECREF(owner);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)arr, owner) < 0) { /* takes owner, even when it fails */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* An array of dtype and shape over info's payload, which it takes (info's
 * payload is cleared): the block is released when the array goes, or here
 * if the array cannot be made. NULL with an exception on failure. */
static PyObject *take_view(rdv_t *h, struct rdv_msg_info *info, PyObject *dtype, PyObject *shape, int writable) {
    if (!PyArray_DescrCheck(dtype) || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > RDV_NDIM_MAX) {
        PyErr_SetString(PyExc_TypeError, "a view needs a numpy dtype and a shape tuple");
        return NULL;
    }
    if (!info->payload) {
        PyErr_SetString(PyExc_ValueError, "no message to make a view of: the info holds none");
        return NULL;
    }
    npy_intp dims[RDV_NDIM_MAX];
    int nd = (int)PyTuple_GET_SIZE(shape);
    if (shape_dims(shape, dims) < 0)
        return NULL;
    Payload *owner = PyObject_New(Payload, &PayloadType);
    if (!owner)
        return NULL; /* info keeps the payload: the caller gives it back */
    owner->h = h;
    owner->payload = info->payload;
    info->payload = NULL; /* the owner's now: released even if we fail below */
    return array_over(dtype, nd, dims, owner->payload, writable ? NPY_ARRAY_CARRAY : NPY_ARRAY_CARRAY_RO,
                      (PyObject *)owner);
}

/* ---- Reserved: the owner of an alloc'd block's mapping -------------------- */

/* The base object of the array alloc gives over a block it reserved: holds
 * the handle's reference that rdv_send_begin passed to the payload, so the
 * segment stays mapped while the array (or anything derived from it) lives;
 * the block itself is committed or discarded by the Allocation. */
typedef struct {
    PyObject_HEAD
    rdv_t *h;
} Reserved;

static void reserved_dealloc(Reserved *self) {
    core_unref(self->h);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ReservedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmrdv._fastpath.Reserved",
    .tp_basicsize = sizeof(Reserved),
    .tp_dealloc = (destructor)reserved_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The mapping under an alloc'd block: kept while the array over it lives.",
};

/* seal(array): the array made read-only, at the C cost of a flag (setflags
 * takes ~100 ns): Allocation's exit seals the buffer its open gave, so that
 * a write after the with block cannot land in a block that may already
 * hold another message. Anything but an ndarray is left alone. */
static PyObject *seal(PyObject *module, PyObject *array) {
    (void)module;
    if (PyArray_Check(array))
        PyArray_CLEARFLAGS((PyArrayObject *)array, NPY_ARRAY_WRITEABLE);
    Py_RETURN_NONE;
}

/* The core's functions are given by init(); the module is unusable before. */
static int ready(void) {
    if (core_send && core_send_many && core_recv_start && core_recv_wait && core_release && core_send_begin &&
        core_unref && core_send_discard)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "shmrdv._fastpath is used through shmrdv, which gives it the core (init)");
    return 0;
}

/* A call the module can serve, with its number of arguments: else 0 with an exception. */
static int entered(Py_ssize_t nargs, Py_ssize_t want, const char *usage) {
    if (!ready())
        return 0;
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return 0;
    }
    return 1;
}

static int as_pointer(PyObject *o, void **out) {
    *out = PyLong_AsVoidPtr(o);
    return *out || !PyErr_Occurred();
}

/* view(h, info, dtype, shape, writable): take_view, for the Python layer
 * (h and info as addresses). */
static PyObject *view(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *h, *info;
    if (!entered(nargs, 5, "view(h, info, dtype, shape, writable)"))
        return NULL;
    if (!as_pointer(args[0], &h) || !as_pointer(args[1], &info))
        return NULL;
    int writable = PyObject_IsTrue(args[4]);
    if (writable < 0)
        return NULL;
    return take_view(h, info, args[2], args[3], writable);
}

/* Point each of n memo slots at its new value, held, and only then let the
 * old values go: whatever their release runs (a destructor may call back
 * into the hot path) finds every memo whole. Guarded by the GIL. */
#define MEMO_MAX 3
static void memo_replace(PyObject **const slots[], PyObject *const values[], int n) {
    PyObject *old[MEMO_MAX];
    for (int i = 0; i < n; i++) {
        Py_INCREF(values[i]);
        old[i] = *slots[i];
        *slots[i] = values[i];
    }
    for (int i = 0; i < n; i++)
        Py_XDECREF(old[i]);
}

/* The descriptor looked up last, the descs it was looked up in and what
 * that said of it (all held): a stream of one kind of message then skips
 * making the key and hashing it. A descriptor always means the same
 * (dtype, shape), so this stays right while descs is cleared; another descs
 * dict starts afresh. Guarded by the GIL. */
static PyObject *last_descs, *last_desc, *last_found;

/* What descs (bytes of a descriptor -> (dtype, shape, nbytes), filled by
 * the Python layer) says info's descriptor is: *parsed a new reference, or
 * NULL if it does not know it or its length disagrees with info's (the
 * Python layer then says what is wrong). -1 with an exception on error. */
static int known(const struct rdv_msg_info *info, PyObject *descs, PyObject **parsed) {
    *parsed = NULL;
    if (info->ndim > RDV_NDIM_MAX)
        return 0;
    /* The descriptor's bytes, from ndim to the end of the dims: the cache key. */
    const char *raw = (const char *)&info->ndim;
    Py_ssize_t raw_len = (Py_ssize_t)(offsetof(struct rdv_msg_info, dims) - offsetof(struct rdv_msg_info, ndim) +
                                      16 * info->ndim);
    PyObject *found;
    if (last_descs == descs && PyBytes_GET_SIZE(last_desc) == raw_len &&
        memcmp(PyBytes_AS_STRING(last_desc), raw, raw_len) == 0) {
        found = last_found;
    } else {
        PyObject *desc = PyBytes_FromStringAndSize(raw, raw_len);
        if (!desc)
            return -1;
        found = PyDict_GetItemWithError(descs, desc); /* borrowed */
        if (!found) {
            Py_DECREF(desc);
            return PyErr_Occurred() ? -1 : 0;
        }
        if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 3) {
            Py_DECREF(desc);
            PyErr_SetString(PyExc_TypeError, "descs values must be (dtype, shape, nbytes)");
            return -1;
        }
        memo_replace((PyObject **const[]){&last_desc, &last_found, &last_descs},
                     (PyObject *const[]){desc, found, descs}, 3);
        Py_DECREF(desc); /* the memo holds it now */
    }
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(found, 2));
    if (PyErr_Occurred())
        return -1;
    if (nbytes == info->nbytes) {
        Py_INCREF(found); /* ours while a view is made, whatever the caches do meanwhile */
        *parsed = found;
    }
    return 0;
}

/* How long a receive in a process of one thread waits with the GIL held
 * (start_and_view): a round trip's answer comes within it; the core's spin
 * looks at the machine's load only past it (RDV_SPIN_FREE_NS), and spins
 * rather than sleeps through a wait this short (RDV_SLEEP_MIN_NS). */
#define GIL_HELD_WAIT_NS 4000

/* Receives that waited with the GIL held, and those of them whose message
 * came within that wait (gil_held_waits()). Guarded by the GIL. */
static unsigned long long held_waits, held_served;

/* Whether this interpreter has one thread: then nobody waits for the GIL.
 * A thread that a C library starts meanwhile (PyGILState_Ensure links its
 * state without the GIL) is missed at worst, and waits GIL_HELD_WAIT_NS. */
static int alone(void) {
    PyThreadState *me = PyThreadState_Get();
    return PyInterpreterState_ThreadHead(PyThreadState_GetInterpreter(me)) == me && PyThreadState_Next(me) == NULL;
}

/* The start of a receive (rdv_recv_start, the GIL released while it
 * waits, but for its first GIL_HELD_WAIT_NS in a process of one thread),
 * then, when a message was taken and descs knows it, its view: what recv
 * below returns. */
static PyObject *start_and_view(void *h, const char *key, Py_ssize_t key_len, long long timeout_ns, uint32_t flags,
                                int writable, void *info_p, void *waiter_p, PyObject *descs) {
    struct rdv_msg_info *info = info_p;
    /* With the GIL released: a first look with it held saves the release
     * for a message already queued, but a receive that then waits pays a
     * second lookup and the empty key's removal and re-creation (measured,
     * round trips got slower by more than streams gained). Except in a
     * process of one thread, where nobody wants the GIL meanwhile (a
     * thread started meanwhile waits for it GIL_HELD_WAIT_NS at most):
     * there the receive starts with it held and spins that long, in line,
     * and only a wait beyond lets it go, so the answer of a round trip,
     * which comes within it, costs no release and retake of the GIL. */
    int rc;
    if (timeout_ns > GIL_HELD_WAIT_NS && alone()) {
        held_waits++;
        rc = core_recv_start(h, key, (uint32_t)key_len, GIL_HELD_WAIT_NS, flags, waiter_p, info);
        if (rc == 0)
            held_served++;
        if (rc == -ETIMEDOUT) {
            /* A signal that came meanwhile is handled now, not at the end of
             * the slice; the caller leaves the line if its handler raises. */
            if (PyErr_CheckSignals() < 0)
                return NULL;
            /* The rest of the slice: in line, or (no record yet) from the
             * start. A first wait that yielded to a sender on our CPU may
             * have lasted longer than GIL_HELD_WAIT_NS (up to one of that
             * sender's time slices): the slice grows by as much. */
            long long rest = timeout_ns - GIL_HELD_WAIT_NS;
            Py_BEGIN_ALLOW_THREADS
            rc = *(uint32_t *)waiter_p ? core_recv_wait(h, waiter_p, rest, flags, NULL, info)
                                       : core_recv_start(h, key, (uint32_t)key_len, rest, flags, waiter_p, info);
            Py_END_ALLOW_THREADS
        }
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = core_recv_start(h, key, (uint32_t)key_len, timeout_ns, flags, waiter_p, info);
        Py_END_ALLOW_THREADS
    }
    if (rc != 0)
        return PyLong_FromLong(rc);
    if (PyErr_CheckSignals() < 0)
        return NULL;
    PyObject *parsed;
    if (known(info, descs, &parsed) < 0)
        return NULL;
    if (!parsed)
        Py_RETURN_NONE;
    PyObject *arr = take_view(h, info, PyTuple_GET_ITEM(parsed, 0), PyTuple_GET_ITEM(parsed, 1), writable);
    Py_DECREF(parsed);
    return arr;
}

/* recv(h, key, timeout_ns, flags, writable, info, waiter, descs): the
 * start of a receive (rdv_recv_start, the GIL released while it waits),
 * then, when a message was taken and descs (bytes of its descriptor ->
 * (dtype, shape, nbytes), filled by the Python layer) knows it, its view.
 * Returns the view; the core's code if no message was taken (info and the
 * waiter word then as the core left them); None if one was taken but its
 * descriptor is not in descs or disagrees with its length (info holds it).
 * A signal that arrived meanwhile raises here, before any view exists,
 * with the message still in info (the caller gives it back). */
static PyObject *recv(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *h, *info_p, *waiter_p;
    char *key;
    Py_ssize_t key_len;
    if (!entered(nargs, 8, "recv(h, key, timeout_ns, flags, writable, info, waiter, descs)"))
        return NULL;
    if (!as_pointer(args[0], &h) || PyBytes_AsStringAndSize(args[1], &key, &key_len) < 0 ||
        !as_pointer(args[5], &info_p) || !as_pointer(args[6], &waiter_p))
        return NULL;
    long long timeout_ns = PyLong_AsLongLong(args[2]);
    unsigned long flags = PyLong_AsUnsignedLong(args[3]);
    int writable = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || writable < 0)
        return NULL;
    if (!PyDict_CheckExact(args[7])) {
        PyErr_SetString(PyExc_TypeError, "descs must be a dict");
        return NULL;
    }
    return start_and_view(h, key, key_len, timeout_ns, (uint32_t)flags, writable, info_p, waiter_p, args[7]);
}

/* The first slice of a receive's wait, in ns: how soon a signal handler
 * (Ctrl-C) runs. The Python layer's slices start from it too (the module's
 * FIRST_SLICE_NS). */
#define FIRST_SLICE_NS 10000000LL
/* Seconds below which a timeout is a finite wait (codec.timeout_ns). */
#define FINITE_S ((double)RDV_FOREVER_NS / 1e9)

/* A receive's first slice, in ns, for the timeout None or a float or an
 * int of seconds that codec.timeout_ns takes as finite without a question;
 * -2 for any other timeout, which recv_key_of and send_key_of leave to the
 * Python layer (it checks it). */
static long long first_slice(PyObject *timeout) {
    double s;
    if (timeout == Py_None)
        return FIRST_SLICE_NS;
    if (PyFloat_CheckExact(timeout)) {
        s = PyFloat_AS_DOUBLE(timeout);
    } else if (PyLong_CheckExact(timeout)) {
        int overflow;
        long long whole = PyLong_AsLongLongAndOverflow(timeout, &overflow);
        if (overflow || whole < 0)
            return -2;
        s = (double)whole;
    } else {
        return -2;
    }
    if (!(s >= 0.0 && s < FINITE_S))
        return -2;
    long long ns = (long long)(s * 1e9);
    return ns < FIRST_SLICE_NS ? ns : FIRST_SLICE_NS;
}

/* The key looked up last in a keys dict and what that gave (all held, so
 * that no other object can come to have their addresses): a loop that
 * sends (or receives) under one key object then skips the lookup. A key
 * str always has the same bytes, so this stays right while keys is
 * cleared; another keys dict starts afresh. One for sends and one for
 * receives, which alternate in a round trip. Guarded by the GIL. */
struct key_memo {
    PyObject *keys, *key, *kb;
};
static struct key_memo send_key_memo, recv_key_memo;

/* The bytes keys (str -> key bytes, the Python layer's cache) holds for
 * key: *kb borrowed, or NULL if it holds none. -1 with an exception. */
static int cached_key(struct key_memo *memo, PyObject *keys, PyObject *key, PyObject **kb) {
    if (memo->key == key && memo->keys == keys) {
        *kb = memo->kb;
        return 0;
    }
    *kb = PyDict_GetItemWithError(keys, key);
    if (!*kb)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyBytes_CheckExact(*kb)) {
        *kb = NULL;
        return 0;
    }
    memo_replace((PyObject **const[]){&memo->keys, &memo->key, &memo->kb}, (PyObject *const[]){keys, key, *kb}, 3);
    return 0;
}

/* This thread's scratch, as rendezvous._thread_scratch made it (info,
 * waiter, the info's bytes, the info's and the waiter's addresses) and
 * keep_scratch kept it in the thread's state dict, which lets it go when
 * the thread ends: borrowed, or NULL (with an exception on error) if this
 * thread has none yet. */
static PyObject *scratch_key; /* "shmrdv._fastpath.scratch", interned once */

/* The thread dict whose scratch thread_scratch found last, and that
 * scratch (both held: no other thread's dict can come to have its
 * address). keep_scratch forgets them. Guarded by the GIL. */
static PyObject *memo_dict, *memo_scratch;

static PyObject *thread_scratch(void) {
    PyObject *d = PyThreadState_GetDict();
    if (d && d == memo_dict)
        return memo_scratch;
    PyObject *scratch = d ? PyDict_GetItemWithError(d, scratch_key) : NULL;
    if (!(scratch && PyTuple_CheckExact(scratch) && PyTuple_GET_SIZE(scratch) == 5))
        return NULL;
    memo_replace((PyObject **const[]){&memo_dict, &memo_scratch}, (PyObject *const[]){d, scratch}, 2);
    return scratch;
}

/* The addresses of the info and the waiter word a scratch holds: 0 with
 * an exception if they are not addresses. */
static int scratch_words(PyObject *scratch, void **info_p, void **waiter_p) {
    return as_pointer(PyTuple_GET_ITEM(scratch, 3), info_p) && as_pointer(PyTuple_GET_ITEM(scratch, 4), waiter_p);
}

/* scratch(): this thread's scratch, or None if it has none yet. */
static PyObject *scratch(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    PyObject *got = thread_scratch();
    if (!got) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(got);
    return got;
}

/* keep_scratch(scratch): this thread's scratch, for thread_scratch. */
static PyObject *keep_scratch(PyObject *module, PyObject *scratch) {
    (void)module;
    PyObject *d = PyThreadState_GetDict();
    if (!PyTuple_CheckExact(scratch) || PyTuple_GET_SIZE(scratch) != 5 || !d) {
        PyErr_SetString(PyExc_TypeError, "keep_scratch needs a thread's scratch, a 5-tuple");
        return NULL;
    }
    if (PyDict_SetItem(d, scratch_key, scratch) < 0)
        return NULL;
    Py_CLEAR(memo_dict);
    Py_CLEAR(memo_scratch);
    Py_RETURN_NONE;
}

/* recv's start as rendezvous.Rendezvous.recv makes it, from the str key
 * and the timeout in seconds (Method's recv): keys (str -> key bytes) must
 * know the key, this thread have a scratch (thread_scratch) and the
 * timeout be one first_slice takes; else None, having done nothing (the
 * Python layer receives). Otherwise what start_and_view returns, except
 * that a message taken whose descriptor descs does not know returns 0 (it
 * is in the scratch's info). */
static PyObject *recv_key_of(PyObject *h_addr, PyObject *key, PyObject *timeout, uint32_t flags, int writable,
                             PyObject *keys, PyObject *descs) {
    void *h, *info_p, *waiter_p;
    if (!PyUnicode_CheckExact(key))
        Py_RETURN_NONE;
    long long step = first_slice(timeout);
    if (step == -2)
        Py_RETURN_NONE;
    PyObject *kb;
    if (cached_key(&recv_key_memo, keys, key, &kb) < 0)
        return NULL;
    if (!kb)
        Py_RETURN_NONE;
    PyObject *scratch = thread_scratch(); /* borrowed: the thread's dict holds it */
    if (!scratch) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (!as_pointer(h_addr, &h) || !scratch_words(scratch, &info_p, &waiter_p))
        return NULL;
    Py_INCREF(kb); /* the key's bytes, while the GIL is released */
    PyObject *got = start_and_view(h, PyBytes_AS_STRING(kb), PyBytes_GET_SIZE(kb), step, flags, writable, info_p,
                                   waiter_p, descs);
    Py_DECREF(kb);
    if (got == Py_None) {
        Py_DECREF(got);
        return PyLong_FromLong(0);
    }
    return got;
}

/* views(h, infos, n, writable, descs, made): the views of infos[0..n) (a
 * batch taken by rdv_recv_many/rdv_recv_more), in order, each owner also
 * appended to made, up to the first whose descriptor descs does not know
 * (or disagrees with its length): that one and those after it stay in
 * their infos for the Python layer. The list of the views made. */
static PyObject *views(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *h, *infos_p;
    if (!entered(nargs, 6, "views(h, infos, n, writable, descs, made)"))
        return NULL;
    if (!as_pointer(args[0], &h) || !as_pointer(args[1], &infos_p))
        return NULL;
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    int writable = PyObject_IsTrue(args[3]);
    if ((n == -1 && PyErr_Occurred()) || writable < 0)
        return NULL;
    if (n < 0 || n > RDV_MANY_MAX || !PyDict_CheckExact(args[4]) || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_ValueError, "views needs 0 <= n <= RDV_MANY_MAX, a dict and a list");
        return NULL;
    }
    struct rdv_msg_info *infos = infos_p;
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *parsed;
        if (known(&infos[i], args[4], &parsed) < 0)
            goto fail;
        if (!parsed)
            break;
        PyObject *arr = take_view(h, &infos[i], PyTuple_GET_ITEM(parsed, 0), PyTuple_GET_ITEM(parsed, 1), writable);
        Py_DECREF(parsed);
        if (!arr)
            goto fail;
        int rc = PyList_Append(args[5], PyArray_BASE((PyArrayObject *)arr));
        if (rc == 0)
            rc = PyList_Append(out, arr);
        Py_DECREF(arr);
        if (rc < 0)
            goto fail;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* The key the Python layer caches arr's send under: (dtype, shape), as
 * rendezvous._send_forms has it, or with key (not NULL) first, as
 * batches._kinds has it. A new reference, NULL with an exception. */
static PyObject *cache_key(PyObject *key, PyArrayObject *arr) {
    int nd = PyArray_NDIM(arr);
    PyObject *shape = PyTuple_New(nd);
    if (!shape)
        return NULL;
    for (int i = 0; i < nd; i++) {
        PyObject *dim = PyLong_FromSsize_t(PyArray_DIMS(arr)[i]);
        if (!dim) {
            Py_DECREF(shape);
            return NULL;
        }
        PyTuple_SET_ITEM(shape, i, dim);
    }
    PyObject *out = key ? PyTuple_Pack(3, key, (PyObject *)PyArray_DESCR(arr), shape)
                        : PyTuple_Pack(2, (PyObject *)PyArray_DESCR(arr), shape);
    Py_DECREF(shape);
    return out;
}

/* The form looked up last, the forms dict it was found in, and the dtype
 * (held) and dims it was found for: a stream of one kind of array then
 * skips building the (dtype, shape) key, hashing it and parsing the form.
 * A (dtype, shape) always has the same form, so this stays right while
 * forms is cleared; another forms dict starts afresh. Guarded by the GIL. */
static PyObject *last_forms, *last_form_descr, *last_form;
static int last_form_nd = -1;
static npy_intp last_form_dims[NPY_MAXDIMS];

/* The form forms has for arr: *form borrowed (held by the cache above), or
 * NULL if forms does not know it. -1 with an exception on error. */
static int form_of(PyArrayObject *arr, PyObject *forms, PyObject **form) {
    int nd = PyArray_NDIM(arr);
    PyObject *descr = (PyObject *)PyArray_DESCR(arr);
    if (last_forms == forms && last_form_descr == descr && last_form_nd == nd &&
        memcmp(last_form_dims, PyArray_DIMS(arr), (size_t)nd * sizeof(npy_intp)) == 0) {
        *form = last_form;
        return 0;
    }
    *form = NULL;
    PyObject *form_key = cache_key(NULL, arr);
    if (!form_key)
        return -1;
    PyObject *found = PyDict_GetItemWithError(forms, form_key); /* borrowed */
    Py_DECREF(form_key);
    if (!found)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(found, 0)) ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(found, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(found, 2))) {
        PyErr_SetString(PyExc_TypeError, "forms values must be (code bytes, dims bytes, nbytes)");
        return -1;
    }
    /* the dims first: no code runs before the memo's old values go */
    last_form_nd = nd;
    memcpy(last_form_dims, PyArray_DIMS(arr), (size_t)nd * sizeof(npy_intp));
    memo_replace((PyObject **const[]){&last_forms, &last_form_descr, &last_form},
                 (PyObject *const[]){forms, descr, found}, 3);
    *form = found;
    return 0;
}

/* send_key_of(h, key, array, forms, keys, timeout): the send of a
 * C-contiguous ndarray whose (dtype, shape) forms knows (-> (dtype code,
 * shape and strides as int64 bytes, nbytes), filled by the Python layer),
 * under a str key keys (str -> key bytes) knows, with a timeout of None or
 * seconds that first_slice takes, without waiting for room. The core's
 * code (0: queued); None, having done nothing, for anything else: the
 * Python layer sends it (and checks the key and the timeout). */
static PyObject *send_key_of(PyObject *h_addr, PyObject *key, PyObject *array, PyObject *forms, PyObject *keys,
                             PyObject *timeout) {
    void *h;
    if (!PyUnicode_CheckExact(key) || !PyArray_CheckExact(array) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)array) ||
        first_slice(timeout) == -2)
        Py_RETURN_NONE;
    if (!as_pointer(h_addr, &h))
        return NULL;
    PyObject *kb;
    if (cached_key(&send_key_memo, keys, key, &kb) < 0)
        return NULL;
    if (!kb)
        Py_RETURN_NONE;
    PyArrayObject *arr = (PyArrayObject *)array;
    int nd = PyArray_NDIM(arr);
    PyObject *form;
    if (form_of(arr, forms, &form) < 0)
        return NULL;
    if (!form)
        Py_RETURN_NONE;
    PyObject *code = PyTuple_GET_ITEM(form, 0), *dims = PyTuple_GET_ITEM(form, 1);
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(form, 2));
    if (nbytes == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (PyBytes_GET_SIZE(dims) != 16 * (Py_ssize_t)nd || nbytes != (unsigned long long)PyArray_NBYTES(arr))
        Py_RETURN_NONE;
    const char *kb_s = PyBytes_AS_STRING(kb), *code_s = PyBytes_AS_STRING(code);
    uint32_t key_len = (uint32_t)PyBytes_GET_SIZE(kb), code_len = (uint32_t)PyBytes_GET_SIZE(code);
    const int64_t *shape_strides = (const int64_t *)PyBytes_AS_STRING(dims);
    int rc;
    if (nbytes <= GIL_HELD_BYTES) {
        /* A small copy: cheaper with the GIL held than released and taken
         * back. A send that finds no room returns at once (timeout 0). */
        rc = core_send(h, kb_s, key_len, code_s, code_len, (uint32_t)nd, shape_strides, shape_strides + nd,
                       PyArray_DATA(arr), nbytes, 0);
        return PyLong_FromLong(rc);
    }
    /* A large copy runs without the GIL, as cffi's calls do: the array is
     * exported meanwhile (no other thread can resize it), and the key's and
     * the form's bytes are held (another thread may drop them from keys or
     * forms). */
    Py_buffer src;
    if (PyObject_GetBuffer((PyObject *)arr, &src, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    Py_INCREF(kb);
    Py_INCREF(code);
    Py_INCREF(dims);
    Py_BEGIN_ALLOW_THREADS
    rc = core_send(h, kb_s, key_len, code_s, code_len, (uint32_t)nd, shape_strides, shape_strides + nd, src.buf,
                   nbytes, 0);
    Py_END_ALLOW_THREADS
    Py_DECREF(dims);
    Py_DECREF(code);
    Py_DECREF(kb);
    PyBuffer_Release(&src);
    return PyLong_FromLong(rc);
}

/* Whether (key, arr) has the kind of prev, the batch's item before it (a
 * pair checked already, held): the same key object, dtype object and
 * shape. */
static int same_kind(PyObject *prev, PyObject *key, PyArrayObject *arr) {
    PyObject *pkey = PyTuple_GET_ITEM(prev, 0);
    PyArrayObject *parr = (PyArrayObject *)PyTuple_GET_ITEM(prev, 1);
    int nd = PyArray_NDIM(arr);
    return pkey == key && PyArray_DESCR(parr) == PyArray_DESCR(arr) && PyArray_NDIM(parr) == nd &&
           memcmp(PyArray_DIMS(parr), PyArray_DIMS(arr), (size_t)nd * sizeof(npy_intp)) == 0;
}

/* send_many(h, batch, kinds): a batch (a list of at most RDV_MANY_MAX
 * (str key, array) tuples) in one rdv_send_many, without waiting for room,
 * when every item is a C-contiguous ndarray whose (key, dtype, shape)
 * kinds knows (-> (the address of its struct rdv_send_item, the object
 * that owns it)) and all of them hold at most MANY_GIL_HELD_BYTES. How
 * many were queued, in order; 0, having sent nothing, for any other batch
 * (the Python layer checks and sends it). */
static PyObject *send_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *h;
    if (!entered(nargs, 3, "send_many(h, batch, kinds)"))
        return NULL;
    if (!as_pointer(args[0], &h))
        return NULL;
    PyObject *batch = args[1], *kinds = args[2];
    if (!PyList_CheckExact(batch) || !PyDict_CheckExact(kinds))
        return PyLong_FromLong(0);
    Py_ssize_t n = PyList_GET_SIZE(batch);
    if (n == 0 || n > RDV_MANY_MAX)
        return PyLong_FromLong(0);
    const struct rdv_send_item *items[RDV_MANY_MAX];
    const void *srcs[RDV_MANY_MAX];
    /* Each item's pair (its array) and kind, held until the core returns:
     * the allocations below may run the garbage collector, and with it
     * code of other threads that could change the batch or drop a kind. */
    PyObject *held[2 * RDV_MANY_MAX];
    Py_ssize_t nheld = 0;
    PyObject *result = NULL, *prev_pair = NULL; /* the last item checked (held) */
    uint64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(batch))
            goto decline; /* shortened meanwhile */
        PyObject *pair = PyList_GET_ITEM(batch, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            goto decline;
        Py_INCREF(pair);
        held[nheld++] = pair;
        PyObject *key = PyTuple_GET_ITEM(pair, 0), *a = PyTuple_GET_ITEM(pair, 1);
        if (!PyUnicode_CheckExact(key) || !PyArray_CheckExact(a) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a))
            goto decline;
        PyArrayObject *arr = (PyArrayObject *)a;
        int nd = PyArray_NDIM(arr);
        PyObject *prev = prev_pair;
        prev_pair = pair;
        if (prev && same_kind(prev, key, arr)) {
            /* the previous item's kind (held above): no key to build and hash */
            items[i] = items[i - 1];
            srcs[i] = PyArray_DATA(arr);
            total += items[i]->nbytes;
            continue;
        }
        PyObject *kind_key = cache_key(key, arr);
        if (!kind_key)
            goto done;
        PyObject *kind = PyDict_GetItemWithError(kinds, kind_key); /* borrowed, then held */
        Py_DECREF(kind_key);
        if (!kind) {
            if (PyErr_Occurred())
                goto done;
            goto decline;
        }
        if (!PyTuple_CheckExact(kind) || PyTuple_GET_SIZE(kind) != 2)
            goto decline;
        Py_INCREF(kind);
        held[nheld++] = kind;
        const struct rdv_send_item *it = PyLong_AsVoidPtr(PyTuple_GET_ITEM(kind, 0));
        if (!it) {
            if (PyErr_Occurred())
                goto done;
            goto decline;
        }
        if (it->nbytes != (uint64_t)PyArray_NBYTES(arr) || it->ndim != (uint32_t)nd)
            goto decline;
        total += it->nbytes;
        items[i] = it;
        srcs[i] = PyArray_DATA(arr);
    }
    if (total > MANY_GIL_HELD_BYTES)
        goto decline;
    uint32_t sent = 0;
    /* The GIL held through the call: no other thread runs meanwhile. No
     * room: it returns at once (timeout 0) with how many it queued. */
    (void)core_send_many(h, items, srcs, (uint32_t)n, 0, &sent);
    result = PyLong_FromUnsignedLong(sent);
    goto done;
decline:
    result = PyLong_FromLong(0);
done:
    while (nheld > 0)
        Py_DECREF(held[--nheld]);
    return result;
}

/* alloc_view(h, key_bytes, form, dtype, shape): Allocation.open's block,
 * reserved for key (bytes) with form (as forms has it: (dtype code, shape
 * and strides as int64 bytes, nbytes)) without waiting for room: (its
 * position, a writable array of dtype and shape over its payload); None,
 * having done nothing, when the arena has no room now (the Python layer
 * waits); the core's code (< 0) for any other failure. */
static PyObject *alloc_view(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *h;
    if (!entered(nargs, 5, "alloc_view(h, key_bytes, form, dtype, shape)"))
        return NULL;
    if (!as_pointer(args[0], &h))
        return NULL;
    PyObject *kb = args[1], *form = args[2], *dtype = args[3], *shape = args[4];
    if (!PyBytes_CheckExact(kb) || !PyTuple_CheckExact(form) || PyTuple_GET_SIZE(form) != 3 ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(form, 0)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(form, 1)) ||
        !PyArray_DescrCheck(dtype) || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > RDV_NDIM_MAX) {
        PyErr_SetString(PyExc_TypeError, "alloc_view needs key bytes, a form, a numpy dtype and a shape tuple");
        return NULL;
    }
    PyObject *code = PyTuple_GET_ITEM(form, 0), *dims = PyTuple_GET_ITEM(form, 1);
    int nd = (int)PyTuple_GET_SIZE(shape);
    unsigned long long nbytes = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(form, 2));
    if (nbytes == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    if (PyBytes_GET_SIZE(dims) != 16 * (Py_ssize_t)nd) {
        PyErr_SetString(PyExc_ValueError, "alloc_view: the form's dims do not match the shape");
        return NULL;
    }
    npy_intp dims_of[RDV_NDIM_MAX];
    if (shape_dims(shape, dims_of) < 0)
        return NULL;
    /* Made before the block is reserved: a failure then leaves nothing to
     * give back. */
    PyObject *out = PyTuple_New(2), *at = NULL;
    Reserved *owner = out ? PyObject_New(Reserved, &ReservedType) : NULL;
    if (!owner) {
        Py_XDECREF(out);
        return NULL;
    }
    owner->h = NULL;
    const int64_t *shape_strides = (const int64_t *)PyBytes_AS_STRING(dims);
    uint64_t pos;
    void *payload;
    /* With the GIL held, as a small send: a reservation copies nothing. */
    int rc = core_send_begin(h, PyBytes_AS_STRING(kb), (uint32_t)PyBytes_GET_SIZE(kb), PyBytes_AS_STRING(code),
                             (uint32_t)PyBytes_GET_SIZE(code), (uint32_t)nd, shape_strides, shape_strides + nd,
                             nbytes, 0, &pos, &payload);
    if (rc < 0) {
        Py_TYPE(owner)->tp_free((PyObject *)owner); /* holds no reference */
        Py_DECREF(out);
        if (rc == -ETIMEDOUT)
            Py_RETURN_NONE;
        return PyLong_FromLong(rc);
    }
    owner->h = h; /* the reference rdv_send_begin passed to the payload */
    /* One reference of ours besides the one array_over takes: if we fail,
     * the block goes back before the segment may be let go. */
    Py_INCREF(owner);
    PyObject *arr = array_over(dtype, nd, dims_of, payload, NPY_ARRAY_CARRAY, (PyObject *)owner);
    if (arr && (at = PyLong_FromUnsignedLongLong(pos))) {
        Py_DECREF(owner);
        PyTuple_SET_ITEM(out, 0, at);
        PyTuple_SET_ITEM(out, 1, arr);
        return out;
    }
    /* no array to hand out: the block goes back, unsent, while our
     * reference still keeps the segment mapped */
    core_send_discard(h, pos);
    Py_XDECREF(arr);
    Py_DECREF(owner);
    Py_DECREF(out);
    return NULL;
}

/* ---- Handle: the attributes of a Rendezvous its hot paths read ------------ */

/* rendezvous.Rendezvous's base: its _h (the core's handle, None once
 * closed), _h_addr (that handle's address) and _routes (None, or the
 * bridge's router) are fields here, so that Method reads them without a
 * dict lookup. To the Python layer they are plain attributes. */
typedef struct {
    PyObject_HEAD
    PyObject *h, *h_addr, *routes;
} Handle;

static PyMemberDef handle_members[] = {
    {"_h", T_OBJECT_EX, offsetof(Handle, h), 0, "the core's handle (cffi), None once closed"},
    {"_h_addr", T_OBJECT_EX, offsetof(Handle, h_addr), 0, "its address, for this module's calls"},
    {"_routes", T_OBJECT_EX, offsetof(Handle, routes), 0, "None, or the router of keys that cross to other hosts"},
    {NULL, 0, 0, 0, NULL},
};

static int handle_traverse(Handle *self, visitproc visit, void *arg) {
    Py_VISIT(self->h);
    Py_VISIT(self->h_addr);
    Py_VISIT(self->routes);
    return 0;
}

static int handle_clear(Handle *self) {
    Py_CLEAR(self->h);
    Py_CLEAR(self->h_addr);
    Py_CLEAR(self->routes);
    return 0;
}

static void handle_dealloc(Handle *self) {
    PyObject_GC_UnTrack(self);
    handle_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject HandleType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmrdv._fastpath.Handle",
    .tp_basicsize = sizeof(Handle),
    .tp_dealloc = (destructor)handle_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The attributes of a Rendezvous that its hot paths in C read.",
    .tp_traverse = (traverseproc)handle_traverse,
    .tp_clear = (inquiry)handle_clear,
    .tp_members = handle_members,
    .tp_new = PyType_GenericNew,
};

/* ---- Method: Rendezvous.send and .recv themselves, in C ------------------ */

/* A method of rendezvous.Rendezvous whose common call runs here whole, with
 * no Python frame: rdv.send(key, array[, timeout=]) and rdv.recv(key[,
 * timeout=, lease=, writable=]) on an open handle with no routes, through
 * send_key_of and recv_key_of, over the Python layer's caches it was made
 * with (rendezvous._hot_methods). Every other call, and every one those
 * decline, goes to the Python method it wraps (__wrapped__), which does it
 * all, as if this were not here. A receive that got further than the hot
 * path finishes (in line, a descriptor to parse, a signal handler's
 * exception after the core's call) goes on in rdv._recv_went_on, and
 * leaves the line through rdv._recv_gave_up if that raises. A method
 * descriptor: rdv.send(...) calls it with rdv first, making no bound
 * method. */
enum { METHOD_SEND, METHOD_RECV };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int kind;
    PyObject *wrapped; /* the Python method */
    PyObject *keys;    /* str -> key bytes (the Python layer's caches, as send_key_of and recv_key_of take them) */
    PyObject *forms;   /* send: (dtype, shape) -> form */
    PyObject *pending; /* send: async_recv.pending, [futures outstanding] */
    PyObject *async_recv; /* send: the module, whose after_send a send that served a future calls */
    PyObject *descs; /* recv */
} Method;

static PyObject *timeout_name, *lease_name, *writable_name;
static PyObject *after_send_name, *went_on_name, *gave_up_name;

static int same_name(PyObject *a, PyObject *b) { return a == b || PyUnicode_Compare(a, b) == 0; }

/* The address of self's handle (self._h_addr) when the hot path may use it:
 * self._h open and self._routes None. A new reference, or NULL with no
 * exception: the Python method then does the call. *h: the handle itself
 * (a new reference), if h is not NULL: what the call goes on with, even
 * if another thread closes self meanwhile. */
static PyObject *open_handle(PyObject *self, PyObject **h) {
    if (!PyObject_TypeCheck(self, &HandleType))
        return NULL;
    Handle *hs = (Handle *)self;
    if (!hs->h || hs->h == Py_None || hs->routes != Py_None || !hs->h_addr || !PyLong_CheckExact(hs->h_addr))
        return NULL;
    if (h) {
        Py_INCREF(hs->h);
        *h = hs->h;
    }
    Py_INCREF(hs->h_addr);
    return hs->h_addr;
}

/* None once sent; NULL to decline, or with an exception on error. */
static PyObject *method_send(Method *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *timeout = Py_None;
    if (nargs != 3)
        return NULL;
    if (kwnames) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || !same_name(PyTuple_GET_ITEM(kwnames, 0), timeout_name))
            return NULL;
        timeout = args[3];
    }
    PyObject *addr = open_handle(args[0], NULL);
    if (!addr)
        return NULL;
    PyObject *got = send_key_of(addr, args[1], args[2], m->forms, m->keys, timeout);
    Py_DECREF(addr);
    if (!got)
        return NULL;
    long rc = got == Py_None ? -1 : PyLong_AsLong(got);
    Py_DECREF(got);
    if (rc != 0) /* declined, or no room (the Python method waits for it), or an error it explains */
        return NULL; /* with PyLong_AsLong's exception, if it raised */
    /* a future of ours it served is done when we return */
    if (PyList_GET_SIZE(m->pending) < 1) {
        PyErr_SetString(PyExc_RuntimeError, "async_recv.pending lost its count");
        return NULL;
    }
    int pending = PyObject_IsTrue(PyList_GET_ITEM(m->pending, 0));
    if (pending < 0)
        return NULL;
    if (pending) {
        PyObject *r = PyObject_CallMethodNoArgs(m->async_recv, after_send_name);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* Whether this thread's scratch says a receive is under way: in line (the
 * waiter word set) or a message taken into its info and not yet a view's. */
static int under_way(void) {
    PyObject *scratch = thread_scratch();
    void *info_p, *waiter_p;
    if (!scratch || !scratch_words(scratch, &info_p, &waiter_p)) {
        PyErr_Clear();
        return 1; /* cannot tell: leaving the line is harmless when not in it */
    }
    return *(uint32_t *)waiter_p != 0 || ((struct rdv_msg_info *)info_p)->payload != NULL;
}

/* The exception now raised, normalized, with its traceback: a new reference. */
static PyObject *raised(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* A received view, or NULL on error; *declined (NULL returned, no
 * exception) when the Python method is to do the call. */
static PyObject *method_recv(Method *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, int *declined) {
    PyObject *timeout = Py_None, *lease = Py_False, *writable = Py_False;
    *declined = 1;
    if (nargs != 2)
        return NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (same_name(name, timeout_name))
            timeout = value;
        else if (same_name(name, lease_name) && (value == Py_True || value == Py_False))
            lease = value;
        else if (same_name(name, writable_name) && (value == Py_True || value == Py_False))
            writable = value;
        else
            return NULL; /* as_torch, a value to check, or a mistake for the Python method to name */
    }
    PyObject *h;
    PyObject *addr = open_handle(args[0], &h);
    if (!addr)
        return NULL;
    PyObject *got = recv_key_of(addr, args[1], timeout, lease == Py_True ? RDV_RECV_LEASED : 0, writable == Py_True,
                                m->keys, m->descs);
    Py_DECREF(addr);
    if (got == Py_None) { /* nothing done */
        Py_DECREF(got);
        Py_DECREF(h);
        return NULL;
    }
    *declined = 0;
    if (got && !PyLong_CheckExact(got)) {
        Py_DECREF(h);
        return got; /* the view */
    }
    /* In line, or a message taken: handlers of signals that came meanwhile
     * run now, and what they raise goes to went_on with the rest. */
    if (got && PyErr_CheckSignals() < 0)
        Py_CLEAR(got);
    if (!got && !(got = raised())) {
        Py_DECREF(h);
        return NULL;
    }
    PyObject *call[] = {args[0], h, args[1], timeout, lease, writable, got};
    PyObject *r = PyObject_VectorcallMethod(went_on_name, call, 7, NULL);
    Py_DECREF(got);
    if (!r) {
        /* Raised with the receive still under way (a signal handler's
         * exception as went_on was entered, before its first line, say):
         * leave the line and give back what was taken, then raise it. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (under_way()) {
            PyObject *left[] = {args[0], h, lease};
            PyObject *ok = PyObject_VectorcallMethod(gave_up_name, left, 3, NULL);
            Py_XDECREF(ok);
            PyErr_Clear(); /* the first exception is the one the caller sees */
        }
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(h);
    return r;
}

static PyObject *method_call(Method *m, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (ready()) {
        if (m->kind == METHOD_SEND) {
            PyObject *r = method_send(m, args, nargs, kwnames);
            if (r || PyErr_Occurred())
                return r;
        } else {
            int declined;
            PyObject *r = method_recv(m, args, nargs, kwnames, &declined);
            if (!declined)
                return r;
        }
    } else {
        PyErr_Clear();
    }
    return PyObject_Vectorcall(m->wrapped, args, nargsf, kwnames);
}

/* rdv.send: a bound method of this descriptor (rdv.send(...) itself makes none). */
static PyObject *method_get(PyObject *self, PyObject *obj, PyObject *type) {
    (void)type;
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

/* What the Python method says of itself (__name__, __qualname__, ...), for
 * help() and inspect, which also follow __wrapped__. */
static PyObject *method_getattro(PyObject *self, PyObject *name) {
    PyObject *r = PyObject_GenericGetAttr(self, name);
    if (r || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return r;
    PyErr_Clear();
    return PyObject_GetAttr(((Method *)self)->wrapped, name);
}

static PyObject *method_doc(Method *m, void *unused) {
    (void)unused;
    return PyObject_GetAttrString(m->wrapped, "__doc__");
}

static PyObject *method_module(Method *m, void *unused) {
    (void)unused;
    return PyObject_GetAttrString(m->wrapped, "__module__");
}

static PyObject *method_wrapped(Method *m, void *unused) {
    (void)unused;
    Py_INCREF(m->wrapped);
    return m->wrapped;
}

/* Pickled by name, as the Python method was (rendezvous.Rendezvous.send). */
static PyObject *method_reduce(Method *m, PyObject *unused) {
    (void)unused;
    return PyObject_GetAttrString(m->wrapped, "__qualname__");
}

static PyMethodDef method_methods[] = {
    {"__reduce__", (PyCFunction)method_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef method_getset[] = {
    {"__doc__", (getter)method_doc, NULL, NULL, NULL},
    {"__module__", (getter)method_module, NULL, NULL, NULL},
    {"__wrapped__", (getter)method_wrapped, NULL, "the Python method, which does every call this one declines", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int method_traverse(Method *m, visitproc visit, void *arg) {
    Py_VISIT(m->wrapped);
    Py_VISIT(m->keys);
    Py_VISIT(m->forms);
    Py_VISIT(m->pending);
    Py_VISIT(m->async_recv);
    Py_VISIT(m->descs);
    return 0;
}

static int method_clear(Method *m) {
    Py_CLEAR(m->wrapped);
    Py_CLEAR(m->keys);
    Py_CLEAR(m->forms);
    Py_CLEAR(m->pending);
    Py_CLEAR(m->async_recv);
    Py_CLEAR(m->descs);
    return 0;
}

static void method_dealloc(Method *m) {
    PyObject_GC_UnTrack(m);
    method_clear(m);
    PyObject_GC_Del(m);
}

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shmrdv._fastpath.Method",
    .tp_basicsize = sizeof(Method),
    .tp_dealloc = (destructor)method_dealloc,
    .tp_vectorcall_offset = offsetof(Method, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = method_getattro,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_traverse = (traverseproc)method_traverse,
    .tp_clear = (inquiry)method_clear,
    .tp_methods = method_methods,
    .tp_getset = method_getset,
    .tp_descr_get = method_get,
};

static Method *new_method(int kind, PyObject *wrapped, PyObject *keys) {
    if (!PyCallable_Check(wrapped) || !PyDict_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "a Method wraps a callable and takes the keys dict");
        return NULL;
    }
    Method *m = PyObject_GC_New(Method, &MethodType);
    if (!m)
        return NULL;
    m->vectorcall = (vectorcallfunc)method_call;
    m->kind = kind;
    m->forms = m->pending = m->async_recv = m->descs = NULL;
    Py_INCREF(wrapped);
    m->wrapped = wrapped;
    Py_INCREF(keys);
    m->keys = keys;
    PyObject_GC_Track(m);
    return m;
}

static PyObject *held(PyObject *o) {
    Py_INCREF(o);
    return o;
}

/* send_method(wrapped, forms, keys, pending, async_recv): Rendezvous.send. */
static PyObject *send_method(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyDict_CheckExact(args[1]) || !PyList_CheckExact(args[3]) || PyList_GET_SIZE(args[3]) < 1) {
        PyErr_SetString(PyExc_TypeError, "send_method(wrapped, forms dict, keys dict, pending list, async_recv)");
        return NULL;
    }
    Method *m = new_method(METHOD_SEND, args[0], args[2]);
    if (!m)
        return NULL;
    m->forms = held(args[1]);
    m->pending = held(args[3]);
    m->async_recv = held(args[4]);
    return (PyObject *)m;
}

/* recv_method(wrapped, keys, descs): Rendezvous.recv. */
static PyObject *recv_method(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "recv_method(wrapped, keys dict, descs dict)");
        return NULL;
    }
    Method *m = new_method(METHOD_RECV, args[0], args[1]);
    if (!m)
        return NULL;
    m->descs = held(args[2]);
    return (PyObject *)m;
}

/* gil_held_waits(): (receives that waited with the GIL held, those whose
 * message came within that wait), since the module was loaded. */
static PyObject *gil_held_waits(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    return Py_BuildValue("(KK)", held_waits, held_served);
}

/* init(send, send_many, recv_start, recv_wait, release_payload, send_begin, unref, send_discard): the
 * core's functions, by address. */
static PyObject *init(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    void *f[8];
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "init(send, send_many, recv_start, recv_wait, release_payload, send_begin, unref, send_discard)");
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        if (!as_pointer(args[i], &f[i]))
            return NULL;
        if (!f[i]) {
            PyErr_SetString(PyExc_ValueError, "init needs the core's eight functions");
            return NULL;
        }
    }
    core_send = f[0];
    core_send_many = f[1];
    core_recv_start = f[2];
    core_recv_wait = f[3];
    core_release = f[4];
    core_send_begin = f[5];
    core_unref = f[6];
    core_send_discard = f[7];
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)(void (*)(void))init, METH_FASTCALL,
     "init(send, send_many, recv_start, recv_wait, release_payload, send_begin, unref, send_discard)"},
    {"alloc_view", (PyCFunction)(void (*)(void))alloc_view, METH_FASTCALL, "alloc_view(h, key_bytes, form, dtype, shape)"},
    {"send_many", (PyCFunction)(void (*)(void))send_many, METH_FASTCALL, "send_many(h, batch, kinds)"},
    {"view", (PyCFunction)(void (*)(void))view, METH_FASTCALL, "view(h, info, dtype, shape, writable)"},
    {"recv", (PyCFunction)(void (*)(void))recv, METH_FASTCALL,
     "recv(h, key, timeout_ns, flags, writable, info, waiter, descs)"},
    {"keep_scratch", (PyCFunction)keep_scratch, METH_O, "keep_scratch(scratch): this thread's, in its state dict"},
    {"seal", (PyCFunction)seal, METH_O, "seal(array): the array made read-only"},
    {"gil_held_waits", (PyCFunction)gil_held_waits, METH_NOARGS,
     "gil_held_waits(): (receives that waited with the GIL held, those served within that wait)"},
    {"scratch", (PyCFunction)scratch, METH_NOARGS, "scratch(): this thread's scratch, or None if it has none yet"},
    {"views", (PyCFunction)(void (*)(void))views, METH_FASTCALL, "views(h, infos, n, writable, descs, made)"},
    {"send_method", (PyCFunction)(void (*)(void))send_method, METH_FASTCALL,
     "send_method(wrapped, forms, keys, pending, async_recv): Rendezvous.send, its hot path in C"},
    {"recv_method", (PyCFunction)(void (*)(void))recv_method, METH_FASTCALL,
     "recv_method(wrapped, keys, descs): Rendezvous.recv, its hot path in C"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "shmrdv._fastpath", "send and recv hot paths and received views, in C", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* The module's attribute name: the type (a static one, made ready). */
static int add_type(PyObject *module, const char *name, PyTypeObject *type) {
    Py_INCREF(type); /* PyModule_AddObject steals it on success (PyModule_AddObjectRef is 3.10+) */
    if (PyModule_AddObject(module, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__fastpath(void) {
    import_array();
    if (PyType_Ready(&PayloadType) < 0 || PyType_Ready(&ReservedType) < 0 || PyType_Ready(&MethodType) < 0 ||
        PyType_Ready(&HandleType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module)
        return NULL;
    scratch_key = PyUnicode_InternFromString("shmrdv._fastpath.scratch");
    timeout_name = PyUnicode_InternFromString("timeout");
    lease_name = PyUnicode_InternFromString("lease");
    writable_name = PyUnicode_InternFromString("writable");
    after_send_name = PyUnicode_InternFromString("after_send");
    went_on_name = PyUnicode_InternFromString("_recv_went_on");
    gave_up_name = PyUnicode_InternFromString("_recv_gave_up");
    if (!scratch_key || !timeout_name || !lease_name || !writable_name ||
        !after_send_name || !went_on_name || !gave_up_name ||
        PyModule_AddIntConstant(module, "FIRST_SLICE_NS", FIRST_SLICE_NS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (add_type(module, "Payload", &PayloadType) < 0 || add_type(module, "Reserved", &ReservedType) < 0 ||
        add_type(module, "Method", &MethodType) < 0 || add_type(module, "Handle", &HandleType) < 0)
        Py_CLEAR(module);
    return module;
}
