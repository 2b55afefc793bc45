// C declarations of the Rust pool's C ABI (crates/pygpukit-pool/src/ffi.rs; keep the two in sync).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct PgkPool PgkPool;

enum {
  PGK_OK = 0,
  PGK_OUT_OF_MEMORY = 1,
  PGK_TOO_LARGE = 2,
  PGK_UNKNOWN_POINTER = 3,
  PGK_DOUBLE_FREE = 4,
  PGK_ALREADY_REGISTERED = 5,
  PGK_INVALID_ARGUMENT = 6,
  PGK_OUT_OF_MEMORY_ALL_DEVICES = 7, /* the process-wide limit over all devices refused */
};

enum { PGK_REUSE = 0, PGK_ALLOCATE = 1 };

typedef struct PgkDecision {
  uint32_t kind;
  uint64_t ptr;
  uint64_t size;
} PgkDecision;

typedef struct PgkOutOfMemory {
  uint64_t requested;
  uint64_t rounded;
  uint64_t in_use;
  uint64_t cached;
  uint64_t limit;
} PgkOutOfMemory;

typedef struct PgkStats {
  uint64_t in_use_bytes;
  uint64_t cached_bytes;
  uint64_t pending_bytes;
  uint64_t peak_in_use_bytes;
  uint64_t in_use_blocks;
  uint64_t cached_blocks;
  uint64_t requests;
  uint64_t reuse_hits;
  uint64_t device_allocations;
  uint64_t frees;
  uint64_t releases;
  uint64_t released_bytes;
  uint64_t limit;
} PgkStats;

typedef void (*PgkReleaseFn)(void* context, uint64_t ptr, uint64_t size);

PgkPool* pgk_pool_new(uint64_t limit);
void pgk_pool_destroy(PgkPool* pool);
int32_t pgk_pool_request(const PgkPool* pool, uint64_t size, uint64_t stream, PgkReleaseFn release,
                         void* context, PgkDecision* decision, PgkOutOfMemory* oom);
int32_t pgk_pool_register(const PgkPool* pool, uint64_t ptr, uint64_t size, uint64_t stream);
int32_t pgk_pool_abandon(const PgkPool* pool, uint64_t size);
int32_t pgk_pool_free(const PgkPool* pool, uint64_t ptr);
uint64_t pgk_pool_release_cached(const PgkPool* pool, uint64_t bytes, PgkReleaseFn release, void* context);
uint64_t pgk_pool_release_stream(const PgkPool* pool, uint64_t stream, PgkReleaseFn release, void* context);
int32_t pgk_pool_set_limit(const PgkPool* pool, uint64_t limit, PgkReleaseFn release, void* context);
int32_t pgk_pool_stats(const PgkPool* pool, PgkStats* out);
int32_t pgk_pool_is_in_use(const PgkPool* pool, uint64_t ptr);
/* Holds of CUDA graph captures (crates/pygpukit-pool/src/pool.rs): blocks freed into a hold are handed
 * out again only by pgk_pool_take_held of that hold and stream (*ptr 0: none fits) until
 * pgk_pool_hold_end. */
uint64_t pgk_pool_hold_begin(const PgkPool* pool);
int32_t pgk_pool_free_held(const PgkPool* pool, uint64_t ptr, uint64_t hold);
int32_t pgk_pool_take_held(const PgkPool* pool, uint64_t size, uint64_t stream, uint64_t hold, uint64_t* ptr);
uint64_t pgk_pool_hold_size(const PgkPool* pool, uint64_t hold);
int32_t pgk_pool_hold_end(const PgkPool* pool, uint64_t hold);
/* Forgets every block and reservation after the device's context was reset (the memory is gone);
 * nothing is reported for release. blocks / bytes (each may be NULL) receive what was forgotten. */
int32_t pgk_pool_reset(const PgkPool* pool, uint64_t* blocks, uint64_t* bytes);
/* The process-wide limit shared by every pool (0: unlimited) and the bytes all pools hold. */
void pgk_budget_set_limit(uint64_t limit);
int32_t pgk_budget_get(uint64_t* limit, uint64_t* reserved);

#ifdef __cplusplus
}
#endif
