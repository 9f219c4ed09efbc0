// Each rank loads only the experts it owns (plus every non-expert weight): the weight tables of
// rank r hold exactly the logical experts of its physical range, for even and uneven splits and
// with replicas.
#include <gtest/gtest.h>

#include <set>

#include "common/golden.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace epmoe {
namespace {

TEST(ExpertOwnership, RankLoadsExactlyItsExperts) {
  for (const std::string name : {"qwen3moe-tiny", "qwen3moe-tiny-v5", "mixtral-tiny"}) {
    ModelConfig cfg = load_model_config(test::fixture(name));
    Checkpoint ck(test::fixture(name));
    const int E = cfg.routing.num_experts;
    for (int R : {1, 3, 4})
      for (int redundant : {0, 2}) {
        Placement p = Placement::make_default(E, R, redundant);
        std::set<int> union_of_ranks;
        for (int r = 0; r < R; r++) {
          Model m(cfg, ck, p, r, ComputeMode::F32);
          const auto want = p.logical_owned_by(r);
          for (size_t l = 0; l < m.weights().layers.size(); l++) {
            const auto& layer = m.weights().layers[l];
            if (!layer.sparse) continue;
            std::vector<int> got;
            for (auto& [e, w] : layer.moe.experts) got.push_back(e);
            EXPECT_EQ(got, want) << name << " R=" << R << " rank " << r << " layer " << l;
            EXPECT_FALSE(layer.moe.router.empty());  // non-expert weights: every rank
          }
          union_of_ranks.insert(want.begin(), want.end());
          if (R > 1) {
            EXPECT_LT(int(want.size()), E) << "rank " << r << " of " << R << " holds every expert";
          }
        }
        EXPECT_EQ(int(union_of_ranks.size()), E) << name << " R=" << R;
      }
  }
}

}  // namespace
}  // namespace epmoe
