#include "ep/combine.h"

#include "util/threads.h"

#include <algorithm>
#include <vector>

namespace epmoe {

void combine_slots(int64_t T, int H, int K, const float* w, const float* rows, float* y) {
  // Tokens split over the threads (prefill reads T * K * H floats here); each token's sum is the
  // same slot-order loop whichever thread runs it.
  parallel_for(T, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, int64_t(K) * H)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; t++) {
      float* yt = y + t * H;
      std::fill(yt, yt + H, 0.0f);
      for (int k = 0; k < K; k++) {
        const float wk = w[t * K + k];
        const float* r = rows + (t * K + k) * H;
        for (int h = 0; h < H; h++) yt[h] += wk * r[h];
      }
    }
  });
}

}  // namespace epmoe
