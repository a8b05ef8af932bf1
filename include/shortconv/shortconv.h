/*
 * shortconv — the short causal depthwise convolution, forward and backward,
 * with exact state gradients.  Stable C ABI.
 *
 * The math (docs/semantics.md is the law): per channel d and sequence n with
 * L_n tokens, width W, state length S >= W-1, u_n = h0_n ++ x_n and
 *
 *   pre_n[t] = bias + sum_{k<W} weight[k] * u_n[S-(W-1)+t+k]     t in [0, L_n)
 *   y_n[t]   = act(pre_n[t]) + residual_n[t]
 *   ht_n[j]  = u_n[L_n + j]                                       j in [0, S)
 *
 * Backward returns exactly the gradients of that definition.
 *
 * Conventions of this header
 * - Every tensor is a description (sc_tensor): pointer, dtype, shape and int64
 *   ELEMENT strides.  Activation-like tensors (x, residual, y, dy, dx) are
 *   always described in LOGICAL order [B, T, D]; a channel-major buffer
 *   [B, D, T] is simply the strides {D*T, 1, T}.  Packed batches may also be
 *   given as [total, D].
 * - A tensor with ndim == 0 is absent.  An absent optional input means its
 *   default (no bias, zero initial state, ...); an absent output is not
 *   computed.
 * - The library never allocates memory: scratch comes from the caller
 *   (sc_conv_args.exec.workspace), sized by sc_*_workspace_size.
 * - Nothing is printed and no global state is kept.  Errors come back as a
 *   status and, when `err` is not NULL, a message naming the argument and
 *   what was expected.  On any error nothing has been written to outputs.
 */
#ifndef SHORTCONV_SHORTCONV_H
#define SHORTCONV_SHORTCONV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define SC_API __declspec(dllexport)
#else
#define SC_API __attribute__((visibility("default")))
#endif

#define SC_VERSION_MAJOR 0
#define SC_VERSION_MINOR 1
#define SC_VERSION_PATCH 0

#define SC_MAX_DIMS 4
#define SC_ERROR_MAX 512
/* Largest accepted width W.  Far beyond any short convolution; it keeps
 * every count a backend derives from W (taps + bias, window rings) small. */
#define SC_MAX_WIDTH 65536

typedef enum sc_status {
  SC_OK = 0,
  SC_ERR_INVALID_ARGUMENT = 1, /* shape, stride, dtype, pointer or value wrong */
  SC_ERR_UNSUPPORTED = 2,      /* valid request this build/backend cannot do   */
  SC_ERR_WORKSPACE = 3,        /* workspace missing or too small               */
  SC_ERR_BACKEND = 4           /* the backend failed (e.g. a CUDA launch error)*/
} sc_status;

typedef enum sc_dtype {
  SC_F32 = 0,
  SC_F16 = 1,
  SC_BF16 = 2,
  SC_F64 = 3,
  SC_I32 = 4, /* cu_seqlens, state indices, ring offsets, seq_idx and the serving indices only */
  SC_I64 = 5,
  SC_BOOL = 6 /* one byte, 0 or 1: has_initial_state only */
} sc_dtype;

typedef enum sc_activation { SC_ACT_NONE = 0, SC_ACT_SILU = 1 } sc_activation;

typedef enum sc_backend {
  SC_BACKEND_CPU = 0,  /* host memory, multi-threaded, fp32 accumulation      */
  SC_BACKEND_CUDA = 1, /* device memory, caller's stream                      */
  SC_BACKEND_REF = 2   /* host memory, the float64 oracle (slow, obvious)     */
} sc_backend;

/* A strided tensor description.  ndim == 0: absent. */
typedef struct sc_tensor {
  void* data;
  int32_t dtype; /* sc_dtype */
  int32_t ndim;  /* 0 (absent) .. SC_MAX_DIMS */
  int64_t shape[SC_MAX_DIMS];
  int64_t stride[SC_MAX_DIMS]; /* in elements, >= 0; 0 = broadcast (inputs only) */
} sc_tensor;

/* Whether a CUDA call's kernel may start while the kernel before it in the
 * stream finishes (programmatic dependent launch; devices of compute capability
 * 9.0 and newer).  Honoured by the engines' common decode steps, a dense batch
 * with the weight as [D, 4] of x's dtype, no flags, rings, tables or parent
 * tokens and index tensors (accepted counts included) of one dtype: one token
 * per sequence on channel-contiguous (vLLM) rows of W-1 entries or contiguous
 * [P, D, S] rows of W-1 or W entries, or 1-5 tokens with accepted counts on
 * vLLM rows (LAUNCH and READS); and by the other steps on channel-contiguous
 * rows with such a weight (READS acts as LAUNCH there).  Every other kernel,
 * every other device and the host backends run as with SC_OVERLAP_NONE.
 * Results never depend on it. */
typedef enum sc_overlap {
  SC_OVERLAP_NONE = 0,   /* a kernel starts once the stream's earlier work has completed */
  SC_OVERLAP_LAUNCH = 1, /* launched early, it waits for the previous kernel's completion
                            before its first access to memory: hides the launch latency,
                            exact whatever the previous kernel reads or writes */
  SC_OVERLAP_READS = 2   /* as LAUNCH, and it may read the state rows, the state indices, the
                            accepted counts, the weight and the bias before that wait: the
                            caller guarantees that
                            the kernel before it in the stream does not write them (in an
                            engine: the projection that produced x).  x and the residual are
                            read, and everything is written, after the wait */
} sc_overlap;

/* How to run.  Zero-initialised means: CPU backend, all threads, automatic
 * tiles, default stream, no workspace, no overlap. */
typedef struct sc_exec {
  int32_t backend;     /* sc_backend */
  int32_t num_threads; /* CPU: 0 = all hardware threads; results never depend on it */
  int64_t tile_t;      /* 0 = automatic; > 0 forces the time-tile length (tests sweep it);
                          longer than the token axis = the whole axis */
  int64_t tile_d;      /* 0 = automatic; > 0 forces the channel-tile width (rounded by the
                          backend); wider than D = all channels */
  void* stream;        /* CUDA: cudaStream_t (NULL = legacy default stream) */
  void* workspace;     /* scratch memory, on the backend's side (host or device) */
  size_t workspace_bytes;
  int32_t overlap;     /* sc_overlap */
} sc_exec;

/*
 * One struct describes the op for both directions; each direction reads the
 * fields it needs and ignores the others.
 *
 *   forward  reads  x, weight, bias, residual, cu_seqlens or seq_idx, initial_state(+indices)
 *            writes y, final_state(+indices)
 *   backward reads  x, weight, bias, cu_seqlens or seq_idx, initial_state(+indices), dy,
 *                   dfinal_state
 *            writes dx, dweight, dbias, dinitial_state     (dresidual == dy)
 *
 * Sequences: dense batch (cu_seqlens absent): N = B sequences of length T.
 * Packed batch: x is [1, total, D] or [total, D] and cu_seqlens [N+1]
 * (int32 or int64, starts at 0, non-decreasing, ends at total; zero-length
 * sequences allowed).
 *
 * States: [N, D, S].  With state indices given ([N], int32/int64), the state
 * tensor is a pool [P, D, S] and sequence n uses row indices[n]; -1 means "no
 * initial state" (zeros) for initial_state_indices and "do not write" for
 * final_state_indices.  final_state may alias initial_state (same memory, a
 * decode step updating its cache in place): every read of a sequence's
 * initial state happens before its final state is written.  A row written
 * for sequence n must not be read as the initial state of another sequence.
 */
typedef struct sc_conv_args {
  uint32_t struct_size; /* sizeof(sc_conv_args); set by sc_conv_args_init */
  int32_t width;        /* 1 <= W <= SC_MAX_WIDTH */
  int32_t state_len;    /* S >= W-1; -1: from the state tensors, else W-1 */
  int32_t activation;   /* sc_activation */

  sc_tensor x;          /* [B, T, D] or packed [total, D]                */
  sc_tensor weight;     /* [D, W]          (dtype independent of x's)    */
  sc_tensor bias;       /* [D]             optional, weight's dtype      */
  sc_tensor residual;   /* like x          optional (forward)            */
  sc_tensor cu_seqlens; /* [N+1]           optional: packed batch        */
  sc_tensor initial_state;         /* [N, D, S] or pool [P, D, S], optional */
  sc_tensor initial_state_indices; /* [N]  optional                         */

  sc_tensor y;                   /* like x, forward output                  */
  sc_tensor final_state;         /* [N, D, S] or pool [P, D, S], optional   */
  sc_tensor final_state_indices; /* [N]  optional                           */

  sc_tensor dy;             /* like x (stride 0 allowed), backward input    */
  sc_tensor dfinal_state;   /* [N, D, S] optional, backward input           */
  sc_tensor dx;             /* like x, optional output                      */
  sc_tensor dweight;        /* [D, W], weight's dtype, optional output      */
  sc_tensor dbias;          /* [D], optional output                         */
  sc_tensor dinitial_state; /* [N, D, S] dense, optional output             */

  /* State addressing of inference engines (docs/semantics.md section 5),
   * read by both directions: */
  sc_tensor has_initial_state; /* [N] bool or int32/int64, optional: false = read a zero
                                  initial state (the final state is still written) */
  sc_tensor ring_offsets;      /* [N] int32/int64 >= 0, optional: state rows are rings;
                                  entry j of sequence n's state is slot (ring_offsets[n]
                                  + j) mod S (causal-conv1d's cache_seqlens) */
  int64_t pad_index;           /* a state index that means "no row" besides -1 (an
                                  engine's pad slot id); -1 by sc_conv_args_init */

  /* Sequence ids (docs/semantics.md section 3), read by both directions: a
   * second way to describe a packed batch.  x is [B, T, D]; each maximal run
   * of one id within a row is a sequence, a negative id a padding token
   * (y = 0, dx = 0, feeds nothing).  State tensors are then pools [P, D, S]
   * whose row i belongs to id i.  Not combined with cu_seqlens, the state
   * indices, has_initial_state, ring_offsets or the serving arguments below. */
  sc_tensor seq_idx;           /* [B, T] int32/int64, optional */

  /* Serving steps of inference engines (docs/semantics.md section 5), forward
   * only (the backward returns SC_ERR_UNSUPPORTED when one is present): */
  sc_tensor num_accepted;  /* [N] int32/int64, optional: speculative decoding.  The window
                              is the W-1 row entries from num_accepted[n] - 1 and the row's
                              first (W-2) + L_n entries become the newest ones (vLLM's
                              num_accepted_tokens) */
  sc_tensor parent_tokens; /* [N, M] int32/int64, optional: tree drafts.  Token t >= 1 of
                              sequence n follows its parent parent_tokens[n, t] in [0, t),
                              token 0 the state (vLLM's retrieve_parent_token) */
  /* Block tables (vLLM's prefix-caching addressing), all three or none, instead of
   * initial_state_indices / final_state_indices: sequence n reads pool row
   * block_table[n, initial_block[n]] and writes row block_table[n, final_block[n]]. */
  sc_tensor block_table;     /* [N, M] int32/int64 */
  sc_tensor initial_block;   /* [N] int32/int64 (vLLM's initial_state_idx) */
  sc_tensor final_block;     /* [N] (vLLM's block_idx_last_scheduled_token) */
  /* Prefix caching, with a block table, all three or none: the state at the k-th block
   * boundary (absolute position m * block_size) strictly inside the chunk is also
   * written, to row block_table[n, first_block[n] + k]. */
  sc_tensor first_block;     /* [N] (vLLM's block_idx_first_scheduled_token) */
  sc_tensor computed_tokens; /* [N] >= 0: the chunk's first absolute position
                                (vLLM's num_computed_tokens) */
  int64_t block_size;        /* >= 1 (vLLM's block_size_to_align); 0: no snapshots */

  /* Padded slots' outputs (docs/semantics.md section 5), forward only, with state
   * indices: 1 = every output of a padded sequence (one whose state indices all name
   * no row: -1 or pad_index) is 0, causal-conv1d's convention; 0 (sc_conv_args_init)
   * = computed from the zero state like any other sequence's. */
  int32_t zero_padded_outputs;

  sc_exec exec;
} sc_conv_args;

/* Zero every field, set struct_size, state_len = -1 and pad_index = -1. */
SC_API void sc_conv_args_init(sc_conv_args* args);

typedef struct sc_error {
  char message[SC_ERROR_MAX]; /* NUL-terminated; "" on success */
} sc_error;

/* Bytes of scratch exec.workspace must provide; a function of the shapes,
 * dtypes, backend and forced tiles only (on CUDA not of the device or its
 * size: a size queried once serves every GPU).  0 is a valid answer.  A size
 * that does not fit in 63 bits is SC_ERR_UNSUPPORTED. */
SC_API sc_status sc_forward_workspace_size(const sc_conv_args* args, size_t* bytes, sc_error* err);
SC_API sc_status sc_backward_workspace_size(const sc_conv_args* args, size_t* bytes, sc_error* err);

SC_API sc_status sc_forward(const sc_conv_args* args, sc_error* err);
SC_API sc_status sc_backward(const sc_conv_args* args, sc_error* err);

/* Validate only: the same argument checks as sc_forward/sc_backward (all but
 * the workspace, whose size sc_*_workspace_size reports), nothing run. */
SC_API sc_status sc_validate(const sc_conv_args* args, int backward, sc_error* err);

SC_API const char* sc_status_string(sc_status status);
SC_API const char* sc_version_string(void); /* "MAJOR.MINOR.PATCH" */
SC_API int32_t sc_version(void);            /* MAJOR*10000 + MINOR*100 + PATCH */
SC_API int32_t sc_has_backend(int32_t backend); /* 1 if compiled in */
/* "cpu", "cuda", "ref" for the backends this ABI knows (compiled in or not),
 * NULL for any other id; the known ids are 0, 1, 2, ... without gaps. */
SC_API const char* sc_backend_name(int32_t backend);
/* "identity", "silu" for the activations of this library, NULL for any other
 * value; the known values are 0, 1, ... without gaps. */
SC_API const char* sc_activation_name(int32_t activation);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SHORTCONV_SHORTCONV_H */
