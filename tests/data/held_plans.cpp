// tests/test_plan_host.py's program: the time-loop planner (seq_plan.cpp),
// compiled alone, over a grid of problems with an H200's limits. Prints
// "plans P held H refused R" for every persistent split the planner offers
// (chosen, candidates, alternatives) and how many of them held_split_fits
// refuses, then "refused <case> <0|1>" for splits built not to fit.
#include <cstdio>

#include "seq_plan.h"

using namespace lltm::cuda_detail;

int main() {
  DeviceLimits d;
  d.sms = 132;
  d.smem_per_block = 232448;
  d.clock_ghz = 1.98;
  d.cluster_kernels = d.grid_kernels = d.mma_kernels = d.multicast = true;
  const ResidentChunks resident = [&](SeqPath, const Split& s) -> int { return d.sms / s.group; };
  int plans = 0, held = 0, held_backward = 0, refused = 0;
  for (int gates : {3, 4}) {
    for (bool backward : {false, true}) {
      for (int elem : {2, 4}) {
        for (long batch : {1L, 5L, 8L, 16L, 40L, 64L, 100L, 256L, 512L}) {
          for (long state : {32L, 64L, 128L, 160L, 200L, 256L, 384L, 400L, 512L, 640L, 768L, 1024L, 1536L}) {
            Problem p;
            p.cell = gates == 3 ? "lltm" : "lstm";
            p.gates = gates;
            p.backward = backward;
            p.steps = 100;
            p.batch = batch;
            p.state = state;
            p.elem = elem;
            p.tensor_cores = true;
            Decision decision;
            try {
              decision = plan_time_loop(p, d, resident);
            } catch (...) {
              continue;
            }
            std::vector<Plan> all = decision.alternatives;
            all.push_back(decision.chosen);
            all.insert(all.end(), decision.candidates.begin(), decision.candidates.end());
            for (const Plan& plan : all) {
              if (plan.path == SeqPath::kLoop || !plan.why_not.empty()) continue;
              ++plans;
              held += plan.split.mma && plan.split.w_regs;
              held_backward += backward && plan.split.mma && plan.split.w_regs;
              if (!held_split_fits(plan.split, backward, gates, state, elem)) {
                ++refused;
                std::printf("unfit %s backward=%d elem=%d B=%ld S=%ld group=%d\n", p.cell, backward, elem,
                            batch, state, plan.split.group);
              }
            }
          }
        }
      }
    }
  }
  std::printf("plans %d held %d backward %d refused %d\n", plans, held, held_backward, refused);
  // A held split of FlashRNN's point (S = 768: 3 tiles, 48 k steps in 8
  // slices of 6), and variations of it the held kernels cannot run.
  Split s;
  s.mma = s.w_regs = true;
  s.rows_padded = 8;
  s.per_thread = 1;
  s.mtiles = 3;
  s.mstack = 3;
  s.ksplit = 8;
  s.threads = 256;
  std::printf("refused fits %d\n", !held_split_fits(s, false, 3, 768, 2));
  Split past = s;
  past.ksplit = 2;  // 24 k steps a task, 6 held
  std::printf("refused past_fragments %d\n", !held_split_fits(past, false, 3, 768, 2));
  past.w_part = true;
  std::printf("refused past_fragments_part %d\n", !held_split_fits(past, false, 3, 768, 2));
  Split wide = s;
  wide.rows_padded = 16;
  std::printf("refused two_b_tiles %d\n", !held_split_fits(wide, false, 3, 768, 2));
  Split many = s;
  many.ksplit = 9;
  std::printf("refused tasks_past_warps %d\n", !held_split_fits(many, false, 3, 768, 2));
  // The backward holds the first k steps of each gate segment: 6 of a
  // task's 6 a segment with one tile (FlashRNN's LLTM; its LSTM too, 24
  // fragments), 4 of 8 with 4 gates in slices of 8 (part-held), 2 of 6 with
  // 3 tiles.
  Split back = s;
  back.mtiles = back.mstack = 1;
  std::printf("refused backward %d\n", !held_split_fits(back, true, 3, 768, 2));
  std::printf("refused backward_four_gates %d\n", !held_split_fits(back, true, 4, 768, 2));
  Split back8 = back;
  back8.ksplit = 6;  // 8 k steps a segment
  std::printf("refused backward_past_fragments %d\n", !held_split_fits(back8, true, 4, 768, 2));
  back8.w_part = true;
  std::printf("refused backward_part %d\n", !held_split_fits(back8, true, 4, 768, 2));
  back.w_part = true;
  std::printf("refused backward_segments_past_fragments %d\n", !held_split_fits(back, true, 19, 768, 2));
  std::printf("refused backward_tiles_past_fragments %d\n", !held_split_fits(s, true, 3, 768, 2));
  std::printf("refused float %d\n", !held_split_fits(s, false, 3, 768, 4));
  Split two_rows = s;
  two_rows.per_thread = 2;
  std::printf("refused two_rows %d\n", !held_split_fits(two_rows, false, 3, 768, 2));
  return 0;
}
