/* impls/router.cuh: the device code of the router kernels (router.cu)
 *
 * The arithmetic is that of the CPU reference, backend/cpu/gmlp-cpu-router.c
 * (its header states the rules): FP32 per token, the same formulas in the
 * same order wherever one thread computes them (the k probabilities, each
 * logit's gradient), but the sums over a token's E experts are added by a
 * team of threads in a tree, and expf() and logf() are CUDA's: results
 * agree with the CPU's within a few ulps, not bit for bit. Every sum has a
 * fixed order, so that each run gives the same bits (graph replays equal
 * eager runs).
 *
 * A token is routed by a team: one warp when E <= kRouterWarpMaxExperts
 * (8 tokens per block), else the whole block. Nothing of a token is kept
 * but a few scalars: every pass reads the logits again (from L1/L2) and
 * computes the values it needs, so no shared memory grows with E beyond
 * the group bitmap.
 *
 * Ranking: a selection value v of expert (or group) i becomes a 48-bit key
 * (rank_key()) whose unsigned order is the documented ranking: the higher
 * value first, equal values by the lower index, NaN below every number and
 * NaNs by index; -0 and +0 are equal. Keys are distinct, 0 is none.
 *
 * - top-k: k rounds; each takes the team's largest key below the previous
 *   round's (a max reduction), so it never needs a sorted list per thread;
 * - groups (when topk_groups < n_groups): a group's key is that of the sum
 *   of its best two values; the topk_groups-th largest group key is found
 *   by a radix select (six 8-bit digits, histograms in shared memory,
 *   group keys computed again in each pass), and the groups at or above it
 *   set their bit in a shared bitmap that the top-k rounds read;
 * - the aux loss's mean probabilities: each P[t, i] (in [0, 1]) is added
 *   as a 64-bit fixed-point integer (psum_scale = 2^s, s = 62 - bits of T,
 *   so that T of them cannot overflow): integer sums do not depend on the
 *   order, so atomics keep them deterministic. The warp kernels add them in
 *   shared memory per block first;
 * - the z-loss: each team's sum of lse² in FP64, per block in warp order
 *   into z_partials, then router_finish_kernel adds those in order.
 *
 * SPDX-License-Identifier: LGPL-2.1-or-later
 */

#pragma once

#include "impls/common.cuh"

namespace gmlp {

constexpr int kRouterThreads = 256;
constexpr int kRouterWarps = kRouterThreads / 32;
/* Up to this many experts a warp routes a token (at most 32 values a lane
 * per pass, and a block's 8 warps share E fixed-point sums in shared
 * memory); above it a block does. */
constexpr uint32_t kRouterWarpMaxExperts = 1024;
constexpr uint32_t kRouterMaxExperts = 65535;
constexpr uint32_t kRouterMaxTopK = 16;
constexpr float kRouterRenormEps = 1e-20f;

/* The options as the kernels read them (router.cu fills them from
 * GmlpKernelRouter). */
struct RouterOptions
{
  int64_t  n_tokens;
  uint32_t n_experts;
  uint32_t top_k;
  uint32_t n_groups;      /* 0: every expert is a candidate */
  uint32_t per_group;     /* n_experts / n_groups */
  uint32_t topk_groups;
  int      softmax;       /* scores: 1 softmax, 0 sigmoid */
  int      on_logits;     /* softmax after top-k: select on the logits */
  int      renormalize;
  float    scaling;
  float    aux_coeff;
  float    z_coeff;
};

struct RouterForwardParams
{
  RouterOptions        o;
  const float         *logits;       /* T × E */
  const float         *bias;         /* E, or nullptr */
  int64_t             *indices;      /* T × k */
  float               *probs;        /* T × k */
  unsigned long long  *counts;       /* E: the INT64 tokens per expert */
  unsigned long long  *psum;         /* E fixed-point sums of P (workspace) */
  unsigned int        *nan_flag;     /* set when a P was NaN (workspace) */
  double              *z_partials;   /* one per block of the main kernel */
  uint32_t             n_partials;
  float                psum_scale;   /* 2^s */
  double               psum_unscale; /* 2^-s */
  float               *aux;
  float               *z;
};

struct RouterBackwardParams
{
  RouterOptions  o;
  const float   *logits;
  const int64_t *indices;
  const int64_t *counts;        /* read only with an aux loss */
  const float   *grad_probs;
  float         *grad_logits;
};

struct RouterBiasParams
{
  uint32_t       n_experts;
  const int64_t *counts;
  float          rate;
  float         *bias;
};

/* What a team shares. The bitmap holds one bit per group: a warp routes at
 * most kRouterWarpMaxExperts experts, so at most that many groups. */
template <int kTeam>
struct RouterTeamShared
{
  static constexpr int kWarps = kTeam / 32;
  static constexpr uint32_t kMaxGroups = kTeam == 32 ? kRouterWarpMaxExperts : kRouterMaxExperts + 1;

  unsigned long long red_u64[kWarps];
  float              red_f32[kWarps];
  uint32_t           pick[2];
  uint32_t           hist[256];
  uint32_t           kept[kMaxGroups / 32];
  int32_t            chosen[kRouterMaxTopK];
  float              coef[kRouterMaxTopK];
};

template <int kTeam>
__device__ __forceinline__ uint32_t
team_rank ()
{
  return kTeam == 32 ? threadIdx.x % 32 : threadIdx.x;
}

template <int kTeam>
__device__ __forceinline__ void
team_sync ()
{
  if constexpr (kTeam == 32)
    __syncwarp ();
  else
    __syncthreads ();
}

/* Reductions by a butterfly: every lane ends with the same bits (each step
 * computes op (x, y) on one lane and op (y, x) on the other, and the ops
 * are commutative). */
struct RouterSum
{
  template <typename T>
  __device__ __forceinline__ T operator() (T a, T b) const { return a + b; }
};

struct RouterMax
{
  __device__ __forceinline__ float operator() (float a, float b) const { return fmaxf (a, b); }
  __device__ __forceinline__ unsigned long long
  operator() (unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};

template <typename T, typename Op>
__device__ __forceinline__ T
warp_reduce (T v, Op op)
{
#pragma unroll
  for (int d = 16; d > 0; d /= 2)
    v = op (v, __shfl_xor_sync (0xffffffffu, v, d));
  return v;
}

/* The team-wide version: a block combines its warps' results in warp
 * order through scratch (one per warp), every thread alike, then waits
 * before the scratch is reused. */
template <int kTeam, typename T, typename Op>
__device__ __forceinline__ T
team_reduce (T v, T *scratch, Op op)
{
  v = warp_reduce (v, op);
  if constexpr (kTeam == 32)
    {
      return v;
    }
  else
    {
      if (threadIdx.x % 32 == 0)
        scratch[threadIdx.x / 32] = v;
      __syncthreads ();
      v = scratch[0];
#pragma unroll
      for (int w = 1; w < kTeam / 32; w++)
        v = op (v, scratch[w]);
      __syncthreads ();
      return v;
    }
}

/* The ranking key of value v at index i (< 65535; see the top). */
__device__ __forceinline__ unsigned long long
rank_key (float v, uint32_t index)
{
  uint32_t bits = __float_as_uint (v == 0.0f ? 0.0f : v), ord;

  if (isnan (v))
    ord = 0;
  else
    ord = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ((unsigned long long) ord << 16) | (0xffffu - index);
}

__device__ __forceinline__ uint32_t
key_index (unsigned long long key)
{
  return 0xffffu - (uint32_t) (key & 0xffffu);
}

/* The value a key was made from (a canonical NaN, +0 for a zero). */
__device__ __forceinline__ float
key_value (unsigned long long key)
{
  uint32_t ord = (uint32_t) (key >> 16);

  if (ord == 0)
    return __int_as_float (0x7fc00000);
  return __uint_as_float ((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

/* As the CPU's: no overflow of expf for either sign; NaN stays NaN. */
__device__ __forceinline__ float
router_sigmoid (float x)
{
  float e;

  if (x >= 0.0f)
    return 1.0f / (1.0f + expf (-x));
  e = expf (x);
  return e / (1.0f + e);
}

/* A token's scalars, the same on every thread of its team. */
struct RouterToken
{
  const float *row;       /* its E logits */
  float        max;       /* softmax: the largest logit (NaNs ignored) */
  float        sum;       /* softmax: Σ expf (l - max) */
  float        lse;       /* max + logf (sum) */
  float        sig_norm;  /* Σ sigmoid (l) + 1e-20: the aux loss's normalizer */
};

__device__ __forceinline__ float
router_softmax (const RouterToken &tok, float l)
{
  return expf (l - tok.max) / tok.sum;
}

__device__ __forceinline__ float
router_score (const RouterOptions &o, const RouterToken &tok, float l)
{
  return o.softmax ? router_softmax (tok, l) : router_sigmoid (l);
}

/* Expert j's selection value: its score, or its logit (softmax after
 * top-k), plus its bias. */
__device__ __forceinline__ float
select_value (const RouterOptions &o, const float *bias, const RouterToken &tok, uint32_t j)
{
  const float l = tok.row[j];
  const float v = o.on_logits ? l : router_score (o, tok, l);

  return v + (bias != nullptr ? bias[j] : 0.0f);
}

/* The softmax statistics (when the scores or the z-loss need them) and the
 * sigmoid normalizer (when the aux loss of sigmoid scores needs it). */
template <int kTeam>
__device__ void
token_stats (const RouterOptions &o, RouterToken &tok, bool need_sig_norm, RouterTeamShared<kTeam> &sh)
{
  const uint32_t rank = team_rank<kTeam> ();
  const uint32_t e = o.n_experts;

  tok.max = 0.0f;
  tok.sum = 1.0f;
  tok.lse = 0.0f;
  tok.sig_norm = 1.0f;
  if (o.softmax || o.z_coeff != 0.0f)
    {
      float m = -__int_as_float (0x7f800000), s = 0.0f;

      for (uint32_t j = rank; j < e; j += kTeam)
        m = fmaxf (m, tok.row[j]);
      /* + 0: fmaxf may give either zero of ±0, and lanes must agree. */
      m = team_reduce<kTeam> (m, sh.red_f32, RouterMax ()) + 0.0f;
      for (uint32_t j = rank; j < e; j += kTeam)
        s += expf (tok.row[j] - m);
      s = team_reduce<kTeam> (s, sh.red_f32, RouterSum ());
      tok.max = m;
      tok.sum = s;
      tok.lse = m + logf (s);
    }
  if (need_sig_norm)
    {
      float s = 0.0f;

      for (uint32_t j = rank; j < e; j += kTeam)
        s += router_sigmoid (tok.row[j]);
      tok.sig_norm = team_reduce<kTeam> (s, sh.red_f32, RouterSum ()) + kRouterRenormEps;
    }
}

/* Keeps the two largest keys. */
__device__ __forceinline__ void
keep_top2 (unsigned long long key, unsigned long long &k0, unsigned long long &k1)
{
  if (key > k0)
    {
      k1 = k0;
      k0 = key;
    }
  else if (key > k1)
    {
      k1 = key;
    }
}

/* A group's key: that of the sum of its best two values (its best one for
 * groups of one), as the CPU adds them. */
__device__ __forceinline__ unsigned long long
group_key (unsigned long long k0, unsigned long long k1, uint32_t per, uint32_t g)
{
  const float v0 = key_value (k0);

  return rank_key (per >= 2 ? v0 + key_value (k1) : v0, g);
}

/* Calls f (g, key) once for every group, on one thread of the team: a
 * thread per group for groups of up to 32 experts, else a warp per group. */
template <int kTeam, typename F>
__device__ __forceinline__ void
for_each_group_key (const RouterOptions &o, const float *bias, const RouterToken &tok, F &&f)
{
  const uint32_t per = o.per_group, n_groups = o.n_groups;

  if (per <= 32)
    {
      for (uint32_t g = team_rank<kTeam> (); g < n_groups; g += kTeam)
        {
          unsigned long long k0 = 0, k1 = 0;

          for (uint32_t i = 0; i < per; i++)
            {
              const uint32_t j = g * per + i;

              keep_top2 (rank_key (select_value (o, bias, tok, j), j), k0, k1);
            }
          f (g, group_key (k0, k1, per, g));
        }
    }
  else
    {
      const uint32_t lane = threadIdx.x % 32;
      const uint32_t warp = kTeam == 32 ? 0 : threadIdx.x / 32;

      /* The bounds are uniform over each warp: all lanes shuffle. */
      for (uint32_t g = warp; g < n_groups; g += kTeam / 32)
        {
          unsigned long long k0 = 0, k1 = 0;

          for (uint32_t i = lane; i < per; i += 32)
            {
              const uint32_t j = g * per + i;

              keep_top2 (rank_key (select_value (o, bias, tok, j), j), k0, k1);
            }
          /* Merges two lanes' best two: the lanes' keys are disjoint (or
           * 0, none). */
#pragma unroll
          for (int d = 16; d > 0; d /= 2)
            {
              const unsigned long long o0 = __shfl_xor_sync (0xffffffffu, k0, d);
              const unsigned long long o1 = __shfl_xor_sync (0xffffffffu, k1, d);

              if (o0 > k0)
                {
                  k1 = k0 > o1 ? k0 : o1;
                  k0 = o0;
                }
              else
                {
                  k1 = k1 > o0 ? k1 : o0;
                }
            }
          if (lane == 0)
            f (g, group_key (k0, k1, per, g));
        }
    }
}

/* One warp, all lanes: the digit (from the top) at which the counts of
 * hist, added from digit 255 down, reach remaining, and the count of the
 * digits above it. */
__device__ __forceinline__ void
pick_digit (const uint32_t *hist, uint32_t remaining, uint32_t *digit, uint32_t *before)
{
  const uint32_t lane = threadIdx.x % 32;
  uint32_t c[8], s = 0, incl, excl, my_digit = 0, my_before = 0, src;
  bool mine, found = false;

#pragma unroll
  for (int i = 0; i < 8; i++)
    {
      c[i] = hist[255 - 8 * lane - i];
      s += c[i];
    }
  incl = s;
#pragma unroll
  for (int d = 1; d < 32; d *= 2)
    {
      const uint32_t other = __shfl_up_sync (0xffffffffu, incl, d);

      if (lane >= (uint32_t) d)
        incl += other;
    }
  excl = incl - s;
  mine = excl < remaining && remaining <= incl;
  if (mine)
    {
      uint32_t acc = excl;

#pragma unroll
      for (int i = 0; i < 8; i++)
        {
          if (!found && acc + c[i] >= remaining)
            {
              found = true;
              my_digit = 255 - 8 * lane - i;
              my_before = acc;
            }
          acc += c[i];
        }
    }
  /* Exactly one lane holds it: the histogram counts at least remaining
   * keys (see group_cutoff()). */
  src = __ffs (__ballot_sync (0xffffffffu, mine)) - 1;
  *digit = __shfl_sync (0xffffffffu, my_digit, src);
  *before = __shfl_sync (0xffffffffu, my_before, src);
}

/* The topk_groups-th largest group key, by a radix select over the keys'
 * six bytes: each pass counts the keys that match the digits chosen so
 * far by their next byte, and keeps the byte where the count from the top
 * reaches the rank still wanted (at least one key always matches). */
template <int kTeam>
__device__ unsigned long long
group_cutoff (const RouterOptions &o, const float *bias, const RouterToken &tok, RouterTeamShared<kTeam> &sh)
{
  const uint32_t rank = team_rank<kTeam> ();
  unsigned long long prefix = 0, mask = 0;
  uint32_t remaining = o.topk_groups;

  for (int shift = 40; shift >= 0; shift -= 8)
    {
      uint32_t digit, before;

      for (uint32_t i = rank; i < 256; i += kTeam)
        sh.hist[i] = 0;
      team_sync<kTeam> ();
      for_each_group_key<kTeam> (o, bias, tok, [&] (uint32_t, unsigned long long key) {
        if ((key & mask) == prefix)
          atomicAdd (&sh.hist[(uint32_t) (key >> shift) & 0xffu], 1u);
      });
      team_sync<kTeam> ();
      if constexpr (kTeam == 32)
        {
          pick_digit (sh.hist, remaining, &digit, &before);
        }
      else
        {
          if (threadIdx.x < 32)
            {
              pick_digit (sh.hist, remaining, &digit, &before);
              if (threadIdx.x == 0)
                {
                  sh.pick[0] = digit;
                  sh.pick[1] = before;
                }
            }
          __syncthreads ();
          digit = sh.pick[0];
          before = sh.pick[1];
        }
      remaining -= before;
      prefix |= (unsigned long long) digit << shift;
      mask |= 0xffull << shift;
      /* The histogram (and pick) are rewritten by the next pass. */
      team_sync<kTeam> ();
    }
  return prefix;
}

/* The bitmap of the token's best topk_groups groups. */
template <int kTeam>
__device__ void
mark_groups (const RouterOptions &o, const float *bias, const RouterToken &tok, RouterTeamShared<kTeam> &sh)
{
  const unsigned long long cutoff = group_cutoff<kTeam> (o, bias, tok, sh);

  for (uint32_t i = team_rank<kTeam> (); i < (o.n_groups + 31) / 32; i += kTeam)
    sh.kept[i] = 0;
  team_sync<kTeam> ();
  for_each_group_key<kTeam> (o, bias, tok, [&] (uint32_t g, unsigned long long key) {
    if (key >= cutoff)
      atomicOr (&sh.kept[g / 32], 1u << (g % 32));
  });
  team_sync<kTeam> ();
}

template <int kTeam>
__device__ __forceinline__ bool
is_candidate (const RouterOptions &o, const RouterTeamShared<kTeam> &sh, uint32_t j)
{
  uint32_t g;

  if (o.n_groups == 0)
    return true;
  g = j / o.per_group;
  return (sh.kept[g / 32] >> (g % 32)) & 1u;
}

/* Routes token t: its indices, probabilities and counts; adds its
 * probabilities to the aux loss's sums (psum: shared or global) and its
 * lse² to z_acc. Ends with the team in step, its scratch free. */
template <int kTeam>
__device__ void
route_token (const RouterForwardParams &p, int64_t t, RouterTeamShared<kTeam> &sh,
             unsigned long long *psum, double &z_acc, bool &nan_seen)
{
  const RouterOptions &o = p.o;
  const uint32_t rank = team_rank<kTeam> ();
  const uint32_t e = o.n_experts, k = o.top_k;
  const bool aux = o.aux_coeff != 0.0f;
  RouterToken tok;
  unsigned long long prev = ~0ull;

  tok.row = p.logits + t * (int64_t) e;
  token_stats<kTeam> (o, tok, aux && !o.softmax, sh);
  if (o.n_groups != 0)
    mark_groups<kTeam> (o, p.bias, tok, sh);

  /* Round r takes the best key below round r - 1's. There are at least k
   * candidates (the host checks k <= topk_groups × per_group), so every
   * round finds one. */
  for (uint32_t r = 0; r < k; r++)
    {
      unsigned long long best = 0;

      for (uint32_t j = rank; j < e; j += kTeam)
        {
          unsigned long long key;

          if (!is_candidate<kTeam> (o, sh, j))
            continue;
          key = rank_key (select_value (o, p.bias, tok, j), j);
          if (key < prev && key > best)
            best = key;
        }
      best = team_reduce<kTeam> (best, sh.red_u64, RouterMax ());
      prev = best;
      if (rank == 0)
        sh.chosen[r] = best != 0 ? (int32_t) key_index (best) : 0;
    }
  team_sync<kTeam> ();

  /* The weights, by one thread in the CPU's order. */
  if (rank == 0)
    {
      float sum = 0.0f;

      if (o.on_logits)
        {
          float m = -__int_as_float (0x7f800000);

          for (uint32_t r = 0; r < k; r++)
            m = fmaxf (m, tok.row[sh.chosen[r]]);
          for (uint32_t r = 0; r < k; r++)
            {
              sh.coef[r] = expf (tok.row[sh.chosen[r]] - m);
              sum += sh.coef[r];
            }
          for (uint32_t r = 0; r < k; r++)
            sh.coef[r] /= sum;
        }
      else
        {
          for (uint32_t r = 0; r < k; r++)
            {
              sh.coef[r] = router_score (o, tok, tok.row[sh.chosen[r]]);
              sum += sh.coef[r];
            }
          if (o.renormalize)
            {
              sum += kRouterRenormEps;
              for (uint32_t r = 0; r < k; r++)
                sh.coef[r] /= sum;
            }
        }
    }
  team_sync<kTeam> ();
  for (uint32_t r = rank; r < k; r += kTeam)
    {
      const int32_t j = sh.chosen[r];

      p.indices[t * k + r] = j;
      p.probs[t * k + r] = sh.coef[r] * o.scaling;
      atomicAdd (&p.counts[j], 1ull);
    }

  if (aux)
    for (uint32_t j = rank; j < e; j += kTeam)
      {
        const float l = tok.row[j];
        const float prob = o.softmax ? router_softmax (tok, l) : router_sigmoid (l) / tok.sig_norm;

        /* prob is in [0, 1] or NaN. */
        if (isnan (prob))
          nan_seen = true;
        else
          atomicAdd (&psum[j], __float2ull_rn (prob * p.psum_scale));
      }
  if (o.z_coeff != 0.0f && rank == 0)
    z_acc += (double) tok.lse * tok.lse;
  /* sh.chosen and sh.coef are rewritten by the next token. */
  team_sync<kTeam> ();
}

/* Zeroes the counts and the aux loss's sums. */
__global__ void __launch_bounds__ (kRouterThreads)
router_init_kernel (const __grid_constant__ RouterForwardParams p)
{
  const uint32_t j = blockIdx.x * kRouterThreads + threadIdx.x;

  if (j < p.o.n_experts)
    {
      p.counts[j] = 0;
      p.psum[j] = 0;
    }
  if (j == 0)
    *p.nan_flag = 0;
}

/* Blocks stride over the tokens: a warp each (kTeam 32, 8 a block) or the
 * block (kTeam kRouterThreads). Each block writes one z partial. */
template <int kTeam>
__global__ void __launch_bounds__ (kRouterThreads)
router_forward_kernel (const __grid_constant__ RouterForwardParams p)
{
  constexpr int kTeams = kRouterThreads / kTeam;
  constexpr uint32_t kBlockSums = kTeam == 32 ? kRouterWarpMaxExperts : 1;

  __shared__ RouterTeamShared<kTeam> teams[kTeams];
  __shared__ unsigned long long block_psum[kBlockSums];
  __shared__ double team_z[kTeams];

  const uint32_t team = kTeam == 32 ? threadIdx.x / 32 : 0;
  const uint32_t e = p.o.n_experts;
  const bool aux = p.o.aux_coeff != 0.0f;
  unsigned long long *psum = kTeam == 32 ? block_psum : p.psum;
  double z_acc = 0.0;
  bool nan_seen = false;

  if (kTeam == 32 && aux)
    for (uint32_t j = threadIdx.x; j < e; j += kRouterThreads)
      block_psum[j] = 0;
  __syncthreads ();

  /* Uniform over the team: its threads reach the same barriers. */
  for (int64_t t = (int64_t) blockIdx.x * kTeams + team; t < p.o.n_tokens; t += (int64_t) gridDim.x * kTeams)
    route_token<kTeam> (p, t, teams[team], psum, z_acc, nan_seen);

  __syncthreads ();
  if (kTeam == 32 && aux)
    for (uint32_t j = threadIdx.x; j < e; j += kRouterThreads)
      if (block_psum[j] != 0)
        atomicAdd (&p.psum[j], block_psum[j]);
  if (nan_seen)
    atomicOr (p.nan_flag, 1u);
  if (team_rank<kTeam> () == 0)
    team_z[team] = z_acc;
  __syncthreads ();
  if (threadIdx.x == 0)
    {
      double s = 0.0;

      for (int i = 0; i < kTeams; i++)
        s += team_z[i];
      p.z_partials[blockIdx.x] = s;
    }
}

/* One block: the two losses, from the counts, the sums of P and the z
 * partials (none read when T is 0). */
__global__ void __launch_bounds__ (kRouterThreads)
router_finish_kernel (const __grid_constant__ RouterForwardParams p)
{
  __shared__ double scratch[kRouterWarps];

  const RouterOptions &o = p.o;
  const bool aux = o.n_tokens > 0 && o.aux_coeff != 0.0f;
  const bool z = o.n_tokens > 0 && o.z_coeff != 0.0f;
  const double n_tokens = (double) o.n_tokens;
  const double tk = n_tokens * o.top_k;
  double aux_sum = 0.0, z_sum = 0.0;

  if (aux)
    for (uint32_t j = threadIdx.x; j < o.n_experts; j += kRouterThreads)
      aux_sum += ((double) (int64_t) p.counts[j] / tk) * ((double) p.psum[j] * p.psum_unscale / n_tokens);
  if (z)
    for (uint32_t i = threadIdx.x; i < p.n_partials; i += kRouterThreads)
      z_sum += p.z_partials[i];
  aux_sum = team_reduce<kRouterThreads> (aux_sum, scratch, RouterSum ());
  z_sum = team_reduce<kRouterThreads> (z_sum, scratch, RouterSum ());
  if (threadIdx.x == 0)
    {
      if (!aux)
        *p.aux = 0.0f;
      else if (*p.nan_flag)
        *p.aux = __int_as_float (0x7fc00000);
      else
        *p.aux = (float) ((double) o.aux_coeff * (double) o.n_experts * aux_sum);
      *p.z = z ? (float) ((double) o.z_coeff * z_sum / n_tokens) : 0.0f;
    }
}

/* The backward of token t: its E logits' gradient, each written once. */
template <int kTeam>
__device__ void
backward_token (const RouterBackwardParams &p, int64_t t, RouterTeamShared<kTeam> &sh)
{
  const RouterOptions &o = p.o;
  const uint32_t rank = team_rank<kTeam> ();
  const uint32_t e = o.n_experts, k = o.top_k;
  const bool aux = o.aux_coeff != 0.0f;
  const bool z = o.z_coeff != 0.0f;
  /* Where the chosen experts' terms go: into the gradient of the softmax
   * scores (ds) or straight into the logits' (d). */
  const bool into_ds = o.softmax && !o.on_logits;
  const double t2k = (double) o.n_tokens * (double) o.n_tokens * (double) k;
  const float z_scale = (float) (2.0 * (double) o.z_coeff / (double) o.n_tokens);
  float *const out = p.grad_logits + t * (int64_t) e;
  RouterToken tok;
  float a_dot = 0.0f, s_dot = 0.0f;

  tok.row = p.logits + t * (int64_t) e;
  token_stats<kTeam> (o, tok, aux && !o.softmax, sh);

  /* The k choices' terms, by one thread in the CPU's order; an index out
   * of range contributes nothing (chosen -1). */
  if (rank == 0)
    {
      float g[kRouterMaxTopK], w[kRouterMaxTopK], dot = 0.0f, sum = 0.0f;
      bool valid[kRouterMaxTopK];

      for (uint32_t r = 0; r < k; r++)
        {
          const int64_t j = p.indices[t * k + r];

          valid[r] = j >= 0 && j < (int64_t) e;
          sh.chosen[r] = valid[r] ? (int32_t) j : -1;
          g[r] = valid[r] ? p.grad_probs[t * k + r] * o.scaling : 0.0f;
        }
      if (o.on_logits)
        {
          /* p = softmax (chosen logits): dl = p (g - Σ p g). */
          float m = -__int_as_float (0x7f800000);

          for (uint32_t r = 0; r < k; r++)
            if (valid[r])
              m = fmaxf (m, tok.row[sh.chosen[r]]);
          for (uint32_t r = 0; r < k; r++)
            {
              w[r] = valid[r] ? expf (tok.row[sh.chosen[r]] - m) : 0.0f;
              sum += w[r];
            }
          for (uint32_t r = 0; r < k; r++)
            w[r] = valid[r] ? w[r] / sum : 0.0f;
          for (uint32_t r = 0; r < k; r++)
            dot += w[r] * g[r];
          for (uint32_t r = 0; r < k; r++)
            sh.coef[r] = w[r] * (g[r] - dot);
        }
      else
        {
          /* p = q / S (S = Σ q + ε) with renormalize, else q. */
          for (uint32_t r = 0; r < k; r++)
            {
              w[r] = valid[r] ? router_score (o, tok, tok.row[sh.chosen[r]]) : 0.0f;
              sum += w[r];
            }
          if (o.renormalize)
            {
              sum += kRouterRenormEps;
              for (uint32_t r = 0; r < k; r++)
                w[r] /= sum;
              for (uint32_t r = 0; r < k; r++)
                dot += g[r] * w[r];
            }
          for (uint32_t r = 0; r < k; r++)
            {
              const float q = valid[r] ? router_score (o, tok, tok.row[sh.chosen[r]]) : 0.0f;
              const float dq = o.renormalize ? (g[r] - dot) / sum : g[r];

              sh.coef[r] = o.softmax ? dq : dq * q * (1.0f - q);
            }
        }
    }
  team_sync<kTeam> ();

  /* The sums over the experts that the last pass needs. */
  if (aux && !o.softmax)
    {
      float s = 0.0f;

      for (uint32_t j = rank; j < e; j += kTeam)
        {
          const float ag = (float) ((double) o.aux_coeff * (double) e * (double) p.counts[j] / t2k);

          s += ag * router_sigmoid (tok.row[j]);
        }
      a_dot = team_reduce<kTeam> (s, sh.red_f32, RouterSum ());
    }
  if (o.softmax)
    {
      float s = 0.0f;

      for (uint32_t j = rank; j < e; j += kTeam)
        {
          float ds = 0.0f;

          if (into_ds)
            for (uint32_t r = 0; r < k; r++)
              if (sh.chosen[r] == (int32_t) j)
                ds += sh.coef[r];
          if (aux)
            ds += (float) ((double) o.aux_coeff * (double) e * (double) p.counts[j] / t2k);
          s += router_softmax (tok, tok.row[j]) * ds;
        }
      s_dot = team_reduce<kTeam> (s, sh.red_f32, RouterSum ());
    }

  for (uint32_t j = rank; j < e; j += kTeam)
    {
      const float l = tok.row[j];
      const float ag = aux ? (float) ((double) o.aux_coeff * (double) e * (double) p.counts[j] / t2k) : 0.0f;
      float d = 0.0f, ds = 0.0f;

      for (uint32_t r = 0; r < k; r++)
        if (sh.chosen[r] == (int32_t) j)
          {
            if (into_ds)
              ds += sh.coef[r];
            else
              d += sh.coef[r];
          }
      if (o.softmax)
        {
          const float s = router_softmax (tok, l);

          if (aux)
            ds += ag;
          d += s * (ds - s_dot);
          if (z)
            d += z_scale * tok.lse * s;
        }
      else
        {
          const float s = router_sigmoid (l);

          /* P = σ / S with S = Σ σ + ε. */
          if (aux)
            d += (ag - a_dot / tok.sig_norm) / tok.sig_norm * s * (1.0f - s);
          if (z)
            d += z_scale * tok.lse * router_softmax (tok, l);
        }
      out[j] = d;
    }
  /* sh.chosen and sh.coef are rewritten by the next token. */
  team_sync<kTeam> ();
}

template <int kTeam>
__global__ void __launch_bounds__ (kRouterThreads)
router_backward_kernel (const __grid_constant__ RouterBackwardParams p)
{
  constexpr int kTeams = kRouterThreads / kTeam;

  __shared__ RouterTeamShared<kTeam> teams[kTeams];

  const uint32_t team = kTeam == 32 ? threadIdx.x / 32 : 0;

  for (int64_t t = (int64_t) blockIdx.x * kTeams + team; t < p.o.n_tokens; t += (int64_t) gridDim.x * kTeams)
    backward_token<kTeam> (p, t, teams[team]);
}

/* One block: bias[i] += rate × sign (mean - load_i). The loads are added
 * in FP64, exactly while their sum is below 2^53 (always, for a routing's
 * counts), so the mean is the CPU's. */
__global__ void __launch_bounds__ (kRouterThreads)
router_update_bias_kernel (const __grid_constant__ RouterBiasParams p)
{
  __shared__ double scratch[kRouterWarps];

  double sum = 0.0, mean;

  for (uint32_t j = threadIdx.x; j < p.n_experts; j += kRouterThreads)
    sum += (double) p.counts[j];
  mean = team_reduce<kRouterThreads> (sum, scratch, RouterSum ()) / (double) p.n_experts;
  for (uint32_t j = threadIdx.x; j < p.n_experts; j += kRouterThreads)
    {
      const double diff = mean - (double) p.counts[j];

      p.bias[j] += diff > 0.0 ? p.rate : diff < 0.0 ? -p.rate : 0.0f;
    }
}

}  // namespace gmlp
