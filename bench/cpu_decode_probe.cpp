// A probe for CPU decoding in f32 with few query rows, without the library: how fast the step could
// run if the head dim, not the query rows, filled the vector lanes. The engine's float kernels keep
// query rows in lanes (src/cpu/kernel_impl.h), so a decode tile of 4 rows (32 query heads on 8 KV
// heads, one new token) leaves 12 of AVX-512's 16 lanes idle. Here, per key, the 4 rows' dot
// products run with d in lanes (8 FMAs per row at d = 128) and are reduced together by one
// unpack/shuffle tree (13 instructions for all 4 sums); P V broadcasts each row's p over V's row.
// Online softmax per 64-key tile, tiles of all 8 KV heads in turn (the engine's order: a key's
// rows of all heads lie side by side). One thread, no masks, scalar exp. Each size is checked
// against an fp64 computation of one head.
//   g++ -O3 -march=native -std=c++17 bench/cpu_decode_probe.cpp -o cpu_decode_probe  (AVX-512)
//   ./cpu_decode_probe; then, for the library on the same shapes:
//   flashattn bench --op decode --dtype f32 --h 32 --h-kv 8 --d 128 --n 256,1024,8192 --threads 1
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int D = 128, H = 8, R = 4, BN = 64;

// (q_0 . k, q_1 . k, q_2 . k, q_3 . k) for one key row k; q holds the 4 rows, D apart.
__m128 dots4(const float* k, const float* q) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int c = 0; c < D / 16; ++c) {
    const __m512 kv = _mm512_loadu_ps(k + 16 * c);
    a0 = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + 0 * D + 16 * c), a0);
    a1 = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + 1 * D + 16 * c), a1);
    a2 = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + 2 * D + 16 * c), a2);
    a3 = _mm512_fmadd_ps(kv, _mm512_loadu_ps(q + 3 * D + 16 * c), a3);
  }
  // Pairs, then quads per 128-bit block, then the four blocks: every block ends as (s0, s1, s2, s3).
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a0, a1), _mm512_unpackhi_ps(a0, a1));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a2, a3), _mm512_unpackhi_ps(a2, a3));
  __m512 u = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))),
                           _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t0), _mm512_castps_pd(t1))));
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4E));
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xB1));
  return _mm512_castps512_ps128(u);
}

struct State {
  float m[R], l[R];
  alignas(64) float o[R][D];
};

// Keys [k0, k0 + nk) of one head into its state. K and V point at the head's first row.
void tile(const float* K, const float* V, int k0, int nk, const float* q, float scale, State& st) {
  alignas(64) float s[R][BN];
  for (int j = 0; j < nk; ++j) {
    alignas(16) float t[4];
    _mm_store_ps(t, dots4(K + size_t(k0 + j) * H * D, q));
    for (int r = 0; r < R; ++r) s[r][j] = t[r] * scale;
  }
  __m512 acc[R][D / 16];
  for (int r = 0; r < R; ++r) {
    float mx = st.m[r];
    for (int j = 0; j < nk; ++j) mx = std::max(mx, s[r][j]);
    const float corr = std::exp(st.m[r] - mx);
    st.m[r] = mx;
    float sum = 0;
    for (int j = 0; j < nk; ++j) sum += s[r][j] = std::exp(s[r][j] - mx);
    st.l[r] = st.l[r] * corr + sum;
    for (int c = 0; c < D / 16; ++c) acc[r][c] = _mm512_mul_ps(_mm512_load_ps(st.o[r] + 16 * c), _mm512_set1_ps(corr));
  }
  for (int j = 0; j < nk; ++j) {
    const float* v = V + size_t(k0 + j) * H * D;
    for (int c = 0; c < D / 16; ++c) {
      const __m512 vv = _mm512_loadu_ps(v + 16 * c);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(_mm512_set1_ps(s[r][j]), vv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < D / 16; ++c) _mm512_store_ps(st.o[r] + 16 * c, acc[r][c]);
}

// K, V: [n][H][D]; Q, O: [H][R][D].
void decode(const float* K, const float* V, int n, const float* Q, float scale, float* O) {
  std::vector<State> st(H);
  for (State& x : st)
    for (int r = 0; r < R; ++r) {
      x.m[r] = -INFINITY;
      x.l[r] = 0;
      std::fill(x.o[r], x.o[r] + D, 0.f);
    }
  for (int k0 = 0; k0 < n; k0 += BN)
    for (int h = 0; h < H; ++h) tile(K + h * D, V + h * D, k0, std::min(BN, n - k0), Q + h * R * D, scale, st[h]);
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < R; ++r)
      for (int d = 0; d < D; ++d) O[(h * R + r) * D + d] = st[h].o[r][d] / st[h].l[r];
}

}  // namespace

int main() {
  const float scale = 1.f / std::sqrt(float(D));
  for (int n : {256, 1024, 8192}) {
    std::vector<float> K(size_t(n) * H * D), V(K.size()), Q(H * R * D), O(H * R * D);
    for (float* a : {K.data(), V.data()})
      for (size_t i = 0; i < K.size(); ++i) a[i] = rand() / float(RAND_MAX) - 0.5f;
    for (float& x : Q) x = rand() / float(RAND_MAX) - 0.5f;
    std::vector<double> us;
    for (int it = 0; it < 60; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      decode(K.data(), V.data(), n, Q.data(), scale, O.data());
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(us.begin(), us.end());
    double err = 0;  // head 0 in fp64
    for (int r = 0; r < R; ++r) {
      std::vector<double> p(n);
      double mx = -1e300, l = 0;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int x = 0; x < D; ++x) dot += double(Q[r * D + x]) * K[size_t(j) * H * D + x];
        mx = std::max(mx, p[j] = dot * scale);
      }
      for (double& v : p) l += v = std::exp(v - mx);
      for (int x = 0; x < D; ++x) {
        double a = 0;
        for (int j = 0; j < n; ++j) a += p[j] * V[size_t(j) * H * D + x];
        err = std::max(err, std::abs(a / l - O[r * D + x]));
      }
    }
    std::printf("n=%5d  median %8.1f us  min %8.1f us  %5.1f GB/s of K and V  max error (head 0) %.1e\n", n,
                us[us.size() / 2], us[0], 2.0 * n * H * D * 4 / us[us.size() / 2] / 1e3, err);
  }
}
