// The training runtime every recipe shares: gradient accumulation normalised by the true number of
// targets, the NaN policy, clipping, the optimizer step and schedule, logging, evaluation,
// checkpointing, exact resume and signal handling. A recipe supplies only what is specific to its
// objective: how one micro-batch turns into a summed loss, and how to evaluate.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "nn/module.h"
#include "optim/optimizer.h"
#include "recipes/config.h"
#include "recipes/metrics.h"

namespace forge {

/// The loss of one micro-batch, summed (not averaged) over its targets, so that accumulation over
/// micro-batches of different sizes can divide by the exact total.
struct MicroBatchLoss {
  Tensor loss_sum;      ///< scalar with graph
  int64_t num_targets;  ///< how many targets the sum covers
  /// Recipe-specific sums for the train line (correct predictions, their counts, partial losses):
  /// added up over the step's micro-batches and handed to Recipe::train_metrics.
  std::map<std::string, double> sums = {};
};

/// State a recipe's data pipeline needs to resume (a loader cursor), stored in checkpoints as
/// counters; keys are the recipe's own, e.g. "data.epoch".
using DataState = std::map<std::string, int64_t>;

struct Recipe {
  /// Forward of micro-batch `micro` of training step `step` (model in train mode, grad on).
  std::function<MicroBatchLoss(int64_t step, int64_t micro)> micro_batch;
  /// Evaluation on the validation split (model in eval mode, no grad); `full` covers the whole
  /// split (the final evaluation), otherwise train.eval_batches batches. Must contain "loss".
  std::function<Metrics(bool full)> evaluate;
  /// Optional text shown at the end of the run (a sample from the model).
  std::function<std::string()> sample;
  /// Optional: metrics for a train line from the logged step's summed MicroBatchLoss::sums.
  std::function<Metrics(const std::map<std::string, double>& sums)> train_metrics;
  /// Optional, for data pipelines with a cursor (samplers that are a function of the step need
  /// neither): the state to checkpoint after a step, and how to restore it on resume.
  std::function<DataState()> data_state;
  std::function<void(const DataState&)> restore_data_state;
  /// Tokens consumed per optimizer step (for tokens_per_s).
  int64_t tokens_per_step = 0;
};

/// Runs `micro(0) .. micro(n - 1)`, backpropagating each summed loss, then divides every gradient
/// of `params` by the total number of targets: k micro-batches of 1 give the gradients of one
/// batch of k, whatever their lengths. Returns the mean loss over all targets and their count.
struct AccumulatedLoss {
  double loss;
  int64_t num_targets;
  std::map<std::string, double> sums;  ///< MicroBatchLoss::sums added up
};
AccumulatedLoss accumulate_gradients(const NamedTensors& params, int64_t n,
                                     const std::function<MicroBatchLoss(int64_t micro)>& micro);

/// Runs `config.train.max_steps` steps of `recipe` on `model` with `optimizer`, resuming from the
/// run directory's latest checkpoint unless train.resume is "never". Returns the process exit code:
/// 0, or 130 / 143 after writing a checkpoint when stopped by SIGINT / SIGTERM. Throws
/// Error(numerical) for a non-finite loss or gradient under nan_policy "abort".
int run_training(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 const Recipe& recipe);

/// Evaluates `recipe` on `model` and returns its metrics (no grad, eval mode, training mode after).
Metrics evaluate_model(nn::Module& model, const Recipe& recipe, bool full);

}  // namespace forge
