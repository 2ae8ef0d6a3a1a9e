// The training runtime every recipe shares: the models of a run (trained ones, checkpointed, and
// frozen ones, referenced by path and digest), gradient accumulation normalised by the true number
// of targets, the NaN policy, clipping, the optimizer step and schedule, logging, evaluation,
// checkpointing, exact resume and signal handling. A recipe supplies only what is specific to its
// objective: how one micro-batch turns into a summed loss (or, for recipes that update several
// times per step, the whole step), and how to evaluate. docs/architecture.md describes the design.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "nn/module.h"
#include "optim/grad_arena.h"
#include "optim/optimizer.h"
#include "runtime/config.h"
#include "runtime/metrics.h"
#include "runtime/rank_agreement.h"  // stop_requested() and join_setup(), for recipes and main()

namespace forge {

/// The loss of one micro-batch, summed (not averaged) over its targets, so that accumulation over
/// micro-batches of different sizes can divide by the exact total.
struct MicroBatchLoss {
  Tensor loss_sum;      ///< scalar with graph
  int64_t num_targets;  ///< how many targets the sum covers
  /// Recipe-specific sums for the train line (correct predictions, their counts, partial losses):
  /// added up over the step's micro-batches and handed to Recipe::train_metrics.
  std::map<std::string, double> sums = {};
  /// The real (not padding) input tokens behind the loss, for tokens_per_s; 0: the step counts
  /// Recipe::tokens_per_step instead.
  int64_t num_tokens = 0;
};

/// State a recipe's data pipeline needs to resume (a loader cursor), stored in checkpoints as
/// counters; keys are the recipe's own, e.g. "data.epoch".
using DataState = std::map<std::string, int64_t>;

/// One model of a run. Trained models are written into the run's checkpoints: all their state, or
/// with `adapters_only` just the parameters the optimizer trains (LoRA), the rest coming from
/// `source`. Frozen models (a teacher, a reference policy, a reward model) stay in eval mode, get no
/// gradients and are never written: checkpoints reference them by path and file digest, and resume
/// refuses a source whose digest changed.
struct RunModel {
  /// "" for the run's main model (checkpoint names unprefixed); others are saved as "<name>.<param>".
  std::string name;
  nn::Module* module = nullptr;
  bool trainable = true;
  bool adapters_only = false;
  /// The checkpoint the weights were loaded from: required for frozen and adapters_only models.
  std::filesystem::path source = {};
};

/// The mean loss of the micro-batches behind one update, and the sums their MicroBatchLoss carried.
struct AccumulatedLoss {
  double loss;
  int64_t num_targets;
  std::map<std::string, double> sums;  ///< MicroBatchLoss::sums added up
  /// What layers reported through the auxiliary-loss channel (nn/aux_loss.h), for the train line:
  /// "aux_loss" (the target-weighted mean of the micro-batches' auxiliary losses, not in `loss`)
  /// and each statistic's mean over its reports. Empty when nothing was reported.
  Metrics aux = {};
  /// The sum of squares of the gradients after the division: the square of their global norm,
  /// not finite when a gradient is not.
  double grad_sum_squares = 0;
  /// Under mpirun: seconds spent after backward waiting for the gradients' all-reduce, and the
  /// part of them after the last rank's backward ended (optim::GradArena::Wait).
  double allreduce_wait_s = 0, allreduce_exposed_s = 0;
  /// MicroBatchLoss::num_tokens added up over the micro-batches and ranks.
  int64_t num_tokens = 0;
};

/// What one optimizer update did.
struct UpdateResult {
  AccumulatedLoss accumulated;
  double grad_norm = 0;  ///< before clipping
  double lr = 0;
  bool skipped = false;  ///< non-finite loss or gradient under train.nan_policy: skip
};

/// Handed to a custom step: backpropagation and optimizer updates with the shared policies (exact
/// token normalisation, NaN policy, clipping, the schedule's lr). Dropout is seeded per forward:
/// before the step and again after every update, from (seed, step, index of the forward), so a
/// custom step is as reproducible and resumable as the standard one.
class StepContext {
 public:
  virtual ~StepContext() = default;
  virtual int64_t step() const = 0;  ///< 0-based index of the step being run
  /// Runs micro(0) .. micro(n - 1), backpropagating each, then one update on the total.
  virtual UpdateResult accumulate_and_update(
      int64_t n, const std::function<MicroBatchLoss(int64_t micro)>& micro) = 0;
  /// Backward of one already computed micro-batch loss, then one update.
  virtual UpdateResult backward_and_update(const MicroBatchLoss& loss) = 0;
};

/// What a custom step reports for its train line: the loss shown and logged, and the sums handed
/// to Recipe::train_metrics. grad_norm and lr come from its last applied update: a step is logged
/// and evaluated when any of its updates applied. An update skipped under train.nan_policy: skip
/// has a non-finite loss; leave it out of both.
struct StepOutcome {
  double loss = 0;
  std::map<std::string, double> sums = {};
};

struct Recipe {
  /// Forward of micro-batch `micro` of training step `step` (trained models in train mode, grad
  /// on). The standard step: train.grad_accum of these, then one update.
  std::function<MicroBatchLoss(int64_t step, int64_t micro)> micro_batch;
  /// For data pipelines with a cursor: moves past micro-batch `micro` without computing it (under
  /// mpirun, each rank skips the micro-batches the other ranks train on). Samplers that are a
  /// function of (step, micro) need none.
  std::function<void(int64_t step, int64_t micro)> skip_micro_batch;
  /// Instead of micro_batch: the whole step, which may update several times (PPO's epochs).
  std::function<StepOutcome(StepContext& context)> custom_step;
  /// Optional: called before each step (after gradual unfreezing is applied).
  std::function<void(int64_t step)> begin_step;
  /// Evaluation on the validation split (models in eval mode, no grad); `full` covers the whole
  /// split (the final evaluation), otherwise train.eval_batches batches. Must contain "loss".
  /// Polls stop_requested() between batches and returns early when it is true (the trainer then
  /// discards the metrics and saves a checkpoint).
  std::function<Metrics(bool full)> evaluate;
  /// Optional text shown at the end of the run (a sample from the model); polls stop_requested()
  /// like evaluate.
  std::function<std::string()> sample;
  /// Optional: metrics for a train line from the logged step's summed MicroBatchLoss::sums.
  std::function<Metrics(const std::map<std::string, double>& sums)> train_metrics;
  /// Optional, for data pipelines with a cursor (samplers that are a function of the step need
  /// neither): the state to checkpoint after a step, and how to restore it on resume.
  std::function<DataState()> data_state;
  std::function<void(const DataState&)> restore_data_state;
  /// Tokens consumed per optimizer step (for tokens_per_s), unless the micro-batches count their
  /// own (MicroBatchLoss::num_tokens).
  int64_t tokens_per_step = 0;
  /// Evaluate the initial model before a fresh run's first step, logged as step 0 (for a
  /// fine-tune: the base model's numbers on the same split).
  bool eval_at_start = false;
};

/// Runs this rank's share of `micro(0) .. micro(n - 1)` (micro m runs on rank m % ranks; the
/// others are passed to `skip`, in order), backpropagating each summed loss into `arena`, sums the
/// gradients and the losses over the ranks, then divides every gradient by the total number of
/// targets: k micro-batches of 1 give the gradients of one batch of k, whatever their lengths and
/// however many ranks run them. Returns the mean loss over all targets and their count.
/// Auxiliary losses that layers report during micro(m) (nn/aux_loss.h) join its objective
/// weighted by its number of targets, so the update follows loss + the target-weighted mean of
/// the micro-batches' auxiliary losses.
AccumulatedLoss accumulate_gradients(optim::GradArena& arena, int64_t n,
                                     const std::function<MicroBatchLoss(int64_t micro)>& micro,
                                     const std::function<void(int64_t micro)>& skip = {});

/// Runs `config.train.max_steps` steps of `recipe` over `models` with `optimizer` (which holds the
/// trained parameters), resuming from the run directory's latest checkpoint unless train.resume is
/// "never", which moves the earlier run aside into <output_dir>/previous-<UTC time>/. Holds an
/// advisory lock on the run directory (<output_dir>/train.lock) meanwhile. Returns the process exit
/// code: 0, or 130 / 143 after writing a checkpoint when stopped by SIGINT / SIGTERM. Throws
/// Error(usage) for a run directory it cannot create, lock or move aside, Error(numerical) for a
/// non-finite loss or gradient under nan_policy "abort" or a non-finite final validation loss (the
/// last step is saved before the final evaluation), Error(checkpoint) when a referenced model
/// changed since the checkpoint.
int run_training(const RunConfig& config, const std::vector<RunModel>& models,
                 optim::Optimizer& optimizer, const Recipe& recipe);
/// The common case: one trained model, saved whole.
int run_training(const RunConfig& config, nn::Module& model, optim::Optimizer& optimizer,
                 const Recipe& recipe);

}  // namespace forge
