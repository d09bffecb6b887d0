/* shoal's C API: what other languages bind to (ctypes, cgo, Rust's bindgen, Julia's ccall).
 *
 * A thin layer over the C++ Communicator (shoal/communicator.h): every call is blocking, as MPI's
 * are, returns a shoal_result, and on failure leaves a message for shoal_last_error() in the
 * calling thread. Element types and reduce operators are the C++ ones, in the same order. The
 * environment the communicator reads (SHOAL_RANK, SHOAL_WORLD_SIZE, SHOAL_STORE, ...) is
 * docs/launch.md's. C99 and C++ alike. */
#ifndef SHOAL_C_H
#define SHOAL_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shoal_comm shoal_comm;

/* The enums are int-sized in C; C++ gets the same with a fixed base, so that any int a C caller
 * passes is a valid value to check rather than undefined behaviour. */
#ifdef __cplusplus
#define SHOAL_ENUM_BASE : int
#else
#define SHOAL_ENUM_BASE
#endif

typedef enum SHOAL_ENUM_BASE {
  SHOAL_SUCCESS = 0,
  SHOAL_INVALID_ARGUMENT = 1, /* a bad argument on this rank (wrong root, null buffer, ...) */
  SHOAL_TIMEOUT = 2,          /* a peer did not come in time; the communicator is aborted */
  SHOAL_PEER_ERROR = 3,       /* a peer failed, left or called differently; the communicator is aborted */
  SHOAL_ERROR = 4             /* anything else (set-up, the store, the system) */
} shoal_result;

typedef enum SHOAL_ENUM_BASE {
  SHOAL_F16, SHOAL_BF16, SHOAL_F32, SHOAL_F64, SHOAL_I8, SHOAL_U8, SHOAL_I32, SHOAL_I64, SHOAL_BOOL
} shoal_dtype;

typedef enum SHOAL_ENUM_BASE { SHOAL_SUM, SHOAL_PROD, SHOAL_MIN, SHOAL_MAX, SHOAL_AVG, SHOAL_BAND, SHOAL_BOR, SHOAL_BXOR } shoal_op;

/* Why the calling thread's last call failed ("" if none has). Valid until that thread's next call. */
const char* shoal_last_error(void);

/* Collective: joins the group the environment describes (store_from_env, then the Communicator).
 * timeout_ms bounds the wait for the store and the others, and is then each op's timeout
 * (Options::timeout); 0 keeps SHOAL_TIMEOUT's value (default 300 s). */
shoal_result shoal_comm_create_from_env(int64_t timeout_ms, shoal_comm** comm);
/* Not collective (see ~Communicator): peers that still wait for this rank fail at once with
 * SHOAL_PEER_ERROR. A rank that stops after an error calls it, so that nobody waits for the
 * timeout. Null is allowed. */
void shoal_comm_destroy(shoal_comm* comm);
int shoal_comm_rank(const shoal_comm* comm);
int shoal_comm_size(const shoal_comm* comm);

shoal_result shoal_allreduce(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op);
shoal_result shoal_broadcast(shoal_comm* comm, void* buf, size_t count, shoal_dtype dt, int root);
shoal_result shoal_reduce(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op, int root);
shoal_result shoal_allgather(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt);
shoal_result shoal_reduce_scatter(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt, shoal_op op);
shoal_result shoal_gather(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt, int root);
shoal_result shoal_scatter(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt, int root);
shoal_result shoal_alltoall(shoal_comm* comm, const void* in, void* out, size_t count, shoal_dtype dt);
shoal_result shoal_barrier(shoal_comm* comm);
shoal_result shoal_send(shoal_comm* comm, const void* buf, size_t count, shoal_dtype dt, int peer, uint64_t tag);
/* peer SHOAL_ANY_SOURCE: the first message with this tag and dtype from any rank. */
#define SHOAL_ANY_SOURCE (-1)
shoal_result shoal_recv(shoal_comm* comm, void* buf, size_t count, shoal_dtype dt, int peer, uint64_t tag);

#ifdef __cplusplus
}
#endif

#endif /* SHOAL_C_H */
