// distill, top to bottom: the distill: section and its rules, the frozen teacher and the student's
// start (its own init, model.init_from, or teacher blocks), the loss both families share (hard
// labels, KL to the teacher at temperature T, cosine of the final hidden states) and what each
// family feeds it (GPT: every next-token target; BERT: the masked positions, plus NSP in the hard
// loss), evaluation against the teacher, `forge eval` and the memory estimate. Every micro-batch of
// a step is a function of (seed, step, micro), so each step draws all of its batches first: the
// counts behind the means (scored positions, real positions, pairs) are then known before the
// first backward, and the loss is exact under gradient accumulation.
#include "recipes/distill.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "core/ops.h"
#include "nn/layers.h"
#include "recipes/bert_objective.h"
#include "runtime/checkpoint.h"
#include "recipes/lm_objective.h"
#include "runtime/trainer.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// distill.init_from_teacher's choices, in TeacherInit's order: the section parses by this table and
// the error lines name a mode by it.
constexpr std::array<const char*, 3> kTeacherInits = {"none", "every_other", "blocks"};

std::string teacher_init_name(TeacherInit init) { return kTeacherInits[size_t(init)]; }

void check_distill(ConfigChecker& checker) {
  check_model_family(checker);
  const RunConfig& c = checker.config();
  if (c.model.arch == "bert") check_bert_specials(checker, "distill");
  const DistillSection s = distill_settings(c);
  checker.cross({"distill.teacher"}, !s.teacher.empty(),
                "distill.teacher: recipe distill needs a teacher; name its run directory or "
                "checkpoint");
  checker.cross({"distill.alpha_ce", "distill.alpha_kd", "distill.alpha_cos"},
                s.alpha_ce + s.alpha_kd + s.alpha_cos > 0,
                "distill.alpha_ce, distill.alpha_kd and distill.alpha_cos are all 0: the student "
                "would learn nothing");
  checker.cross({"distill.init_from_teacher", "model.init_from"},
                s.init_from_teacher == TeacherInit::none || c.model.init_from.empty(),
                "distill.init_from_teacher '" + teacher_init_name(s.init_from_teacher) +
                    "' and model.init_from both initialise the student; choose one");
  const std::vector<int64_t>& blocks = s.teacher_blocks;
  const bool listed = s.init_from_teacher == TeacherInit::blocks;
  checker.cross({"distill.teacher_blocks", "distill.init_from_teacher"}, listed || blocks.empty(),
                "distill.teacher_blocks is read only with distill.init_from_teacher: blocks (it is '" +
                    teacher_init_name(s.init_from_teacher) + "')");
  if (!listed) return;
  checker.cross({"distill.teacher_blocks", "model.n_layers"},
                int64_t(blocks.size()) == c.model.n_layers,
                "distill.teacher_blocks names " + std::to_string(blocks.size()) +
                    " teacher blocks; the student has model.n_layers " +
                    std::to_string(c.model.n_layers) + ", one for each");
  std::set<int64_t> seen;
  for (int64_t b : blocks)
    checker.cross({"distill.teacher_blocks"}, seen.insert(b).second,
                  "distill.teacher_blocks: teacher block " + std::to_string(b) +
                      " is named twice; each starts one student block");
}

// The teacher's checkpoint and the config stored in it.
std::pair<fs::path, RunConfig> teacher_checkpoint(const RunConfig& config) {
  const fs::path file = resolve_checkpoint(distill_settings(config).teacher);
  return {file, load_config_string(read_checkpoint_info(file).config_yaml, file.string(), {},
                                   ConfigFiles::skip)};
}

int64_t num_parameters(const RunConfig& config) {
  if (config.model.arch == "gpt") return nn::gpt_num_parameters(gpt_config(config.model));
  return nn::bert_num_parameters(bert_config(config));
}

// The teacher's weights are held (no gradient, no optimizer state) and its forward runs without a
// graph; the logits of both models are held at once, the teacher's without a gradient.
MemoryEstimate estimate_distill(const RunConfig& config) {
  if (config.model.arch == "gpt")
    nn::check_config(gpt_config(config.model));
  else
    nn::check_config(bert_config(config));
  const auto [file, teacher] = teacher_checkpoint(config);
  // forge validate reports a student block the teacher lacks, as forge train would.
  teacher_blocks_for_student(config, teacher.model.n_layers);
  const int64_t student = num_parameters(config);
  const int64_t projection = distill_settings(config).alpha_cos > 0 &&
                                     teacher.model.d_model != config.model.d_model
                                 ? config.model.d_model * teacher.model.d_model
                                 : 0;
  double rows = double(config.train.batch_size * config.model.context);
  if (config.model.arch == "bert") rows *= bert_settings(config).mask_prob;
  return estimate_memory(config, student + projection + num_parameters(teacher),
                         student + projection, 1.5 * rows);
}

// The frozen teacher, built from its stored config.
struct Teacher {
  fs::path file;
  std::unique_ptr<nn::GPT> gpt;
  std::unique_ptr<nn::Bert> bert;
  int64_t n_layers = 0, width = 0;
  nn::Module& module() const {
    if (gpt) return *gpt;
    return *bert;
  }
};

Teacher load_teacher(const RunConfig& config) {
  Teacher t;
  RunConfig stored;
  std::tie(t.file, stored) = teacher_checkpoint(config);
  if (config.model.arch == "gpt")
    t.gpt = std::move(load_gpt(t.file).model);
  else
    t.bert = std::move(load_bert(t.file).model);
  if (t.gpt) store_frozen(config, *t.gpt);
  if (t.bert) store_frozen(config, *t.bert);
  t.n_layers = stored.model.n_layers;
  t.width = stored.model.d_model;
  if (stored.model.context < config.model.context)
    throw Error(ExitCode::usage,
                "model.context (" + std::to_string(config.model.context) +
                    ") exceeds the context of distill.teacher '" + t.file.string() + "' (" +
                    std::to_string(stored.model.context) +
                    "): the teacher must see every position the student sees");
  return t;
}

// The student's start on a fresh run: model.init_from (already loaded by the caller) or the
// teacher's layers. A resumed run takes its own checkpoint instead.
void init_student(nn::Module& student, const RunConfig& config, const Teacher& teacher) {
  const bool resuming = config.train.resume == "auto" && latest_checkpoint(config.output_dir);
  const std::vector<int64_t> blocks = teacher_blocks_for_student(config, teacher.n_layers);
  if (resuming || blocks.empty()) return;
  if (read_checkpoint_info(teacher.file).references.count("model"))
    throw Error(ExitCode::usage,
                "distill.init_from_teacher: the teacher " + teacher.file.string() +
                    " holds LoRA adapters only; export it merged (forge export --merge) and name "
                    "that file as distill.teacher");
  init_student_from_teacher(student, teacher.file, blocks);
}

// Everything the shared loss reads from one micro-batch, whichever the family.
struct DistillTerms {
  Tensor hard_sum;                        // hard-label loss summed per scored position (graph)
  Tensor student_logits, teacher_logits;  // [N, V] rows the KL scores
  Tensor kd_targets;                      // [N]; kIgnoreTarget rows are not scored (or undefined)
  Tensor student_hidden, teacher_hidden;  // [R, C] final hidden states of the real positions
  int64_t scored = 0;
  std::map<std::string, double> sums = {};
};

// What a step's micro-batches hold together: the denominators of the loss's means (examples:
// BERT's pairs, for NSP).
struct StepTotals {
  int64_t scored = 0, real = 0, examples = 0;
};

KLDivOptions kl_options(const DistillSection& s) {
  KLDivOptions kl;
  kl.temperature = s.temperature;
  kl.reverse = s.reverse_kl;
  kl.ignore_index = LMWindows::kIgnoreTarget;
  kl.reduction = Reduction::sum;
  return kl;
}

// alpha_ce * hard + alpha_kd * T^2 KL summed over the scored positions, and alpha_cos * (1 - cos)
// summed over the real positions scaled by scored / real of the whole step: the trainer divides by
// the step's scored positions, which turns each sum into its mean over the step. A term whose
// weight is 0 is still computed for the train line, without a graph.
MicroBatchLoss distill_loss(const DistillTerms& t, const DistillSection& s,
                            const StepTotals& step, const nn::Linear* projection) {
  std::vector<Tensor> terms;
  auto weighted = [&](const Tensor& sum_term, double alpha, double scale = 1.0) {
    if (alpha > 0) terms.push_back(mul(sum_term, alpha * scale));
    return sum_term.item();
  };
  std::map<std::string, double> sums = t.sums;
  sums["scored"] = double(t.scored);
  sums["ce_loss"] = weighted(t.hard_sum, s.alpha_ce);
  {
    std::optional<NoGradGuard> no_grad;
    if (s.alpha_kd == 0) no_grad.emplace();
    sums["kd_loss"] = weighted(
        kd_kl_div(t.student_logits, t.teacher_logits, t.kd_targets, kl_options(s)), s.alpha_kd);
  }
  if (s.alpha_cos > 0) {
    const Tensor h = projection ? projection->forward(t.student_hidden) : t.student_hidden;
    const Tensor one_minus_cos = sum(add(neg(cosine_similarity(h, t.teacher_hidden)), 1.0));
    sums["real"] = double(t.student_hidden.size(0));
    sums["cos_loss"] = weighted(one_minus_cos, s.alpha_cos,
                                double(step.scored) / double(std::max<int64_t>(step.real, 1)));
  }
  Tensor loss = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) loss = add(loss, terms[i]);
  return {loss, t.scored, std::move(sums)};
}

Metrics distill_train_metrics(const std::map<std::string, double>& sums) {
  const double scored = std::max(sums.at("scored"), 1.0);
  Metrics m = {{"ce_loss", sums.at("ce_loss") / scored}, {"kd_loss", sums.at("kd_loss") / scored}};
  if (sums.count("cos_loss")) m.push_back({"cos_loss", sums.at("cos_loss") / sums.at("real")});
  return m;
}

// Rows where the two models' top-1 predictions agree, among the scored rows.
int64_t count_agreeing(const Tensor& student_logits, const Tensor& teacher_logits,
                       const Tensor& targets) {
  std::vector<int64_t> a = argmax(student_logits, -1).to_vector<int64_t>();
  std::vector<int64_t> b = argmax(teacher_logits, -1).to_vector<int64_t>();
  std::vector<int64_t> t = targets.defined() ? targets.to_vector<int64_t>()
                                             : std::vector<int64_t>(a.size(), 0);
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += t[i] != LMWindows::kIgnoreTarget && a[i] == b[i];
  return n;
}

// What evaluations add to the student's metrics: the teacher's loss on the same data, the KL
// between the two and their top-1 agreement, from sums over the scored positions.
struct Agreement {
  double kd_sum = 0;
  int64_t agree = 0, scored = 0;
  void add(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& targets,
           int64_t scored_rows, const DistillSection& s) {
    kd_sum += kd_kl_div(student_logits, teacher_logits, targets, kl_options(s)).item();
    agree += count_agreeing(student_logits, teacher_logits, targets);
    scored += scored_rows;
  }
  void append(Metrics& m, double teacher_loss) const {
    const double n = double(std::max<int64_t>(scored, 1));
    m.push_back({"teacher_loss", teacher_loss});
    m.push_back({"kd_loss", kd_sum / n});
    m.push_back({"top1_agree", double(agree) / n});
  }
};

Metrics gpt_distill_eval(const nn::GPT& student, const nn::GPT& teacher, const LMWindows& val,
                         int64_t batch_size, int64_t batches, bool full, const DistillSection& s) {
  double loss = 0, teacher_loss = 0;
  Agreement agreement;
  for_each_eval_batch(val, batch_size, batches, full, [&](const LMBatch& batch) {
    LMForward st = lm_forward(student, batch), te = lm_forward(teacher, batch);
    loss += st.loss_sum.item();
    teacher_loss += te.loss_sum.item();
    agreement.add(st.logits, te.logits, st.targets, st.num_targets, s);
  });
  const double n = double(std::max<int64_t>(agreement.scored, 1));
  Metrics m = {{"loss", loss / n}, {"ppl", std::exp(loss / n)}, {"tokens", agreement.scored}};
  agreement.append(m, teacher_loss / n);
  return m;
}

Metrics bert_distill_eval(const nn::Bert& student, const nn::Bert& teacher, const BertPairs& val,
                          uint64_t seed, int64_t batch_size, int64_t pairs,
                          const DistillSection& s) {
  std::map<std::string, double> student_sums, teacher_sums;
  Agreement agreement;
  for_each_eval_pair_batch(val, seed, batch_size, pairs, [&](const BertBatch& batch) {
    PairLosses st = pair_losses(student, batch), te = pair_losses(teacher, batch);
    for (const auto& [key, value] : st.sums) student_sums[key] += value;
    for (const auto& [key, value] : te.sums) teacher_sums[key] += value;
    agreement.add(st.mlm_logits, te.mlm_logits, Tensor(), batch.num_mlm_targets(), s);
  });
  Metrics m = bert_eval_metrics(student_sums, pairs);
  agreement.append(m, bert_eval_metrics(teacher_sums, pairs).front().value.as_double());
  return m;
}

// What a family hands the shared training loop.
struct StudentRun {
  nn::Module* student = nullptr;
  int64_t width = 0;
  /// Draws the step's micro-batches and counts them.
  std::function<StepTotals(int64_t step)> begin_step;
  std::function<DistillTerms(int64_t micro, const StepTotals& step)> terms;
  std::function<Metrics(bool full)> evaluate;
  std::function<Metrics(const std::map<std::string, double>& sums)> family_metrics;
  std::function<std::string()> sample;
  int64_t tokens_per_step = 0;
};

int run_distill(const RunConfig& config, const Teacher& teacher, const StudentRun& run) {
  const DistillSection s = distill_settings(config);
  init_student(*run.student, config, teacher);
  // With unequal widths the cosine compares the teacher's states with a learned projection of the
  // student's, trained and saved beside it.
  std::unique_ptr<nn::Linear> projection;
  if (s.alpha_cos > 0 && run.width != teacher.width) {
    Generator gen(uint64_t(config.seed), rng_stream("cos_projection"));
    projection = std::make_unique<nn::Linear>(run.width, teacher.width, false, gen);
  }
  NamedTensors trained = run.student->named_parameters();
  std::vector<RunModel> models = {{"", run.student},
                                  {"teacher", &teacher.module(), false, false, teacher.file}};
  if (projection) {
    for (const NamedTensor& p : projection->named_parameters())
      trained.push_back({"cos_projection." + p.name, p.tensor});
    models.push_back({"cos_projection", projection.get()});
  }
  std::unique_ptr<optim::Optimizer> optimizer = build_optimizer(config, trained);

  // The step's totals need all its micro-batches, also under mpirun, where a rank runs only some.
  StepTotals step_totals;
  int64_t totals_step = -1;
  Recipe recipe;
  recipe.tokens_per_step = run.tokens_per_step;
  recipe.micro_batch = [&](int64_t step, int64_t micro) {
    if (step != totals_step) {
      step_totals = run.begin_step(step);
      totals_step = step;
    }
    return distill_loss(run.terms(micro, step_totals), s, step_totals, projection.get());
  };
  recipe.train_metrics = [&](const std::map<std::string, double>& sums) {
    Metrics m = distill_train_metrics(sums);
    if (run.family_metrics)
      for (Metric& metric : run.family_metrics(sums)) m.push_back(std::move(metric));
    return m;
  };
  recipe.evaluate = run.evaluate;
  recipe.sample = run.sample;
  return run_training(config, models, *optimizer, recipe);
}

// The StudentRun fields both families fill alike: the student, its width and throughput, and a
// begin_step that draws the step's micro-batches into `batches` and adds up `count` of each.
template <class Batch>
StudentRun student_run(nn::Module& student, const RunConfig& config, std::vector<Batch>& batches,
                       std::function<Batch(int64_t step, int64_t micro)> sample,
                       std::function<StepTotals(const Batch&)> count) {
  const int64_t accum = config.train.grad_accum;
  StudentRun run;
  run.student = &student;
  run.width = config.model.d_model;
  run.tokens_per_step = config.train.batch_size * config.model.context * accum;
  run.begin_step = [&batches, accum, sample, count](int64_t step) {
    batches.clear();
    StepTotals totals;
    for (int64_t m = 0; m < accum; ++m) {
      batches.push_back(sample(step, m));
      const StepTotals c = count(batches.back());
      totals.scored += c.scored;
      totals.real += c.real;
      totals.examples += c.examples;
    }
    return totals;
  };
  return run;
}

int train_gpt_student(const RunConfig& config, const Teacher& teacher) {
  LMSplits data = load_lm_splits(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::GPT student(gpt_config(config.model), init);
  init_weights(student, config);
  student.set_activation_checkpointing(config.train.activation_checkpointing);

  const int64_t B = config.train.batch_size;
  const auto seed = uint64_t(config.seed);
  std::vector<LMBatch> batches;
  StudentRun run = student_run<LMBatch>(
      student, config, batches,
      [&](int64_t step, int64_t micro) { return data.train->sample(B, seed, step, micro); },
      [](const LMBatch& batch) {
        return StepTotals{count_scored(batch.targets), batch.ids.numel(), batch.ids.size(0)};
      });
  run.terms = [&](int64_t micro, const StepTotals&) {
    const LMBatch& batch = batches[size_t(micro)];
    LMForward st = lm_forward(student, batch);
    LMForward te;
    {
      NoGradGuard no_grad;
      te = lm_outputs(*teacher.gpt, batch);
    }
    return DistillTerms{.hard_sum = st.loss_sum,
                        .student_logits = st.logits,
                        .teacher_logits = te.logits,
                        .kd_targets = st.targets,
                        .student_hidden = reshape(st.hidden, {-1, st.hidden.size(-1)}),
                        .teacher_hidden = reshape(te.hidden, {-1, te.hidden.size(-1)}),
                        .scored = st.num_targets};
  };
  const DistillSection s = distill_settings(config);
  run.evaluate = [&](bool full) {
    return gpt_distill_eval(student, *teacher.gpt, *data.val, B, config.train.eval_batches, full,
                            s);
  };
  run.sample = [&] { return sample_text(student, *data.tokenizer, "\n", config); };
  return run_distill(config, teacher, run);
}

// Rows b*L + t of the positions a batch's attention mask marks real.
Tensor real_positions(const BertBatch& batch) {
  std::vector<int64_t> mask = batch.attention_mask.to_vector<int64_t>();
  std::vector<double> rows;
  for (size_t i = 0; i < mask.size(); ++i)
    if (mask[i] != 0) rows.push_back(double(i));
  return from_vector(rows, {int64_t(rows.size())}, DType::i64);
}

Tensor hidden_rows(const Tensor& hidden, const Tensor& rows) {
  return index_select(reshape(hidden, {-1, hidden.size(-1)}), 0, rows);
}

int train_bert_student(const RunConfig& config, const Teacher& teacher) {
  BertData data = load_bert_data(config);
  Generator init(uint64_t(config.seed), rng_stream("init"));
  nn::Bert student(bert_config(config), init);
  init_weights(student, config);
  student.set_activation_checkpointing(config.train.activation_checkpointing);

  const int64_t B = config.train.batch_size;
  const auto seed = uint64_t(config.seed);
  std::vector<BertBatch> batches;
  StudentRun run = student_run<BertBatch>(
      student, config, batches,
      [&](int64_t step, int64_t micro) { return data.train->sample(B, seed, step, micro); },
      [](const BertBatch& batch) {
        return StepTotals{batch.num_mlm_targets(), real_positions(batch).numel(),
                          batch.nsp_labels.numel()};
      });
  // The hard loss is mean MLM over the step's chosen positions plus mean NSP over its pairs, as
  // bert_pretrain: the NSP sum is scaled by chosen positions / pairs of the whole step.
  run.terms = [&](int64_t micro, const StepTotals& step) {
    const BertBatch& batch = batches[size_t(micro)];
    const double nsp_scale = double(step.scored) / double(std::max<int64_t>(step.examples, 1));
    PairLosses st = pair_losses(student, batch);
    PairLosses te;
    {
      NoGradGuard no_grad;
      te = pair_losses(*teacher.bert, batch);
    }
    const Tensor rows = real_positions(batch);
    return DistillTerms{.hard_sum = add(st.mlm_sum, mul(st.nsp_sum, nsp_scale)),
                        .student_logits = st.mlm_logits,
                        .teacher_logits = te.mlm_logits,
                        .kd_targets = Tensor(),
                        .student_hidden = hidden_rows(st.outputs.hidden, rows),
                        .teacher_hidden = hidden_rows(te.outputs.hidden, rows),
                        .scored = batch.num_mlm_targets(),
                        .sums = std::move(st.sums)};
  };
  const DistillSection s = distill_settings(config);
  run.evaluate = [&](bool full) {
    return bert_distill_eval(student, *teacher.bert, *data.val, seed, B,
                             bert_eval_pair_count(config, full), s);
  };
  run.family_metrics = pair_metrics;
  return run_distill(config, teacher, run);
}

}  // namespace

std::vector<int64_t> teacher_blocks_for_student(const RunConfig& config, int64_t teacher_layers) {
  const DistillSection s = distill_settings(config);
  const std::string& teacher = s.teacher;
  std::vector<int64_t> blocks;
  if (s.init_from_teacher == TeacherInit::every_other) {
    for (int64_t s = 0; s < config.model.n_layers; ++s) blocks.push_back(2 * s);
    if (!blocks.empty() && blocks.back() >= teacher_layers)
      throw Error(ExitCode::usage,
                  "distill.init_from_teacher: every_other takes teacher blocks 0, 2, ..., " +
                      std::to_string(blocks.back()) + " for model.n_layers " +
                      std::to_string(config.model.n_layers) + ", but distill.teacher '" +
                      teacher + "' has " + std::to_string(teacher_layers) + " blocks");
  } else if (s.init_from_teacher == TeacherInit::blocks) {
    blocks = s.teacher_blocks;
    for (int64_t b : blocks)
      if (b >= teacher_layers)
        throw Error(ExitCode::usage, "distill.teacher_blocks: block " + std::to_string(b) +
                                         " is not in distill.teacher '" + teacher +
                                         "', which has blocks 0 to " +
                                         std::to_string(teacher_layers - 1));
  }
  return blocks;
}

InitReport init_student_from_teacher(nn::Module& student, const fs::path& teacher_file,
                                     const std::vector<int64_t>& blocks) {
  // The teacher's blocks are those its stored config declares; its tensor names come from a file
  // and are checked against them ("blocks.<t>.<...>").
  const int64_t teacher_layers = stored_config(teacher_file).model.n_layers;
  std::set<std::string> block_prefixes;
  for (int64_t t = 0; t < teacher_layers; ++t)
    block_prefixes.insert("blocks." + std::to_string(t) + ".");
  for (const TensorSpec& spec : read_checkpoint_info(teacher_file).main_model())
    if (spec.name.rfind("blocks.", 0) == 0 &&
        !block_prefixes.count(spec.name.substr(0, spec.name.find('.', 7) + 1)))
      throw Error(ExitCode::checkpoint,
                  detail::concat(teacher_file.string(), ": tensor '", spec.name,
                                 "' is not in one of the teacher's blocks 0 to ",
                                 teacher_layers - 1, " (its model.n_layers is ", teacher_layers,
                                 ")"));
  InitOptions options;
  for (int64_t t = 0; t < teacher_layers; ++t) {
    const std::string from = "blocks." + std::to_string(t) + ".";
    auto chosen = std::find(blocks.begin(), blocks.end(), t);
    options.rename.push_back(
        {from, chosen == blocks.end()
                   ? "unused_teacher_" + from
                   : "blocks." + std::to_string(chosen - blocks.begin()) + "."});
  }
  options.allow_unexpected = {"unused_teacher_blocks.*"};
  return init_from_checkpoint(student, teacher_file, options);
}

ConfigSection distill_section() {
  return {
      "distill",
      "knowledge distillation: the frozen teacher, the student's start and the loss weights",
      {section_key("distill.teacher",
                   checkpoint_key()
                       .aka({"teacher_model", "teacher_path"})
                       .inherits_keys({"model.arch", "model.vocab_size", "data.tokenizer",
                                       "data.special_tokens"}),
                   "the frozen teacher: a run directory or a checkpoint; its family, vocabulary, "
                   "tokenizer and special tokens are the student's"),
       section_key("distill.init_from_teacher",
                   choice_key(kTeacherInits[0], {kTeacherInits.begin(), kTeacherInits.end()}),
                   "the student's start on a fresh run: its own init, teacher blocks 0, 2, 4, ... "
                   "(DistilBERT), or distill.teacher_blocks; embeddings, final norm and heads "
                   "come from the teacher too"),
       section_key("distill.teacher_blocks", integer_list_key({}, ">= 0"),
                   "with init_from_teacher: blocks, the teacher block each student block starts "
                   "from, in order, one per student block"),
       section_key("distill.temperature", number_key(2.0, "> 0").aka({"T", "temp"}),
                   "softmax temperature T of both models in the KL term (scaled by T^2)"),
       section_key("distill.alpha_ce", number_key(0.5, ">= 0").aka({"alpha_mlm", "ce_weight"}),
                   "weight of the hard-label loss: next-token CE (gpt); MLM + NSP CE (bert)"),
       section_key("distill.alpha_kd", number_key(0.5, ">= 0").aka({"kd_weight", "alpha"}),
                   "weight of T^2 KL(p_teacher || p_student) over the scored positions"),
       section_key("distill.alpha_cos", number_key(0.0, ">= 0").aka({"cos_weight"}),
                   "weight of 1 - cos(student, teacher) of the final hidden states over the real "
                   "positions"),
       section_key("distill.kl", choice_key("forward", {"forward", "reverse"}),
                   "forward: KL(p_teacher || p_student); reverse: KL(p_student || p_teacher)")}};
}

DistillSection distill_settings(const RunConfig& config) {
  const std::string& init = config.get<std::string>("distill.init_from_teacher");
  return {.teacher = config.get<std::string>("distill.teacher"),
          .init_from_teacher = TeacherInit(
              std::find(kTeacherInits.begin(), kTeacherInits.end(), init) - kTeacherInits.begin()),
          .teacher_blocks = config.get<std::vector<int64_t>>("distill.teacher_blocks"),
          .temperature = config.get<double>("distill.temperature"),
          .alpha_ce = config.get<double>("distill.alpha_ce"),
          .alpha_kd = config.get<double>("distill.alpha_kd"),
          .alpha_cos = config.get<double>("distill.alpha_cos"),
          .reverse_kl = config.get<std::string>("distill.kl") == "reverse"};
}

RecipeSpec distill_recipe() {
  return {.name = "distill",
          .doc = "a smaller GPT or BERT trained from a frozen teacher (knowledge distillation)",
          .families = {"gpt", "bert"},
          .sections = {"distill", "bert"},
          .check = check_distill,
          .train = train_distill,
          .eval = eval_distill,
          .estimate = estimate_distill};
}

int train_distill(const RunConfig& config) {
  Teacher teacher = load_teacher(config);
  if (config.model.arch == "gpt") return train_gpt_student(config, teacher);
  return train_bert_student(config, teacher);
}

int eval_distill(const RunConfig& config, const fs::path& checkpoint_file, const CommandOptions&) {
  Teacher teacher = load_teacher(config);
  const DistillSection s = distill_settings(config);
  const int64_t B = config.train.batch_size;
  Metrics m;
  int64_t step = 0;
  if (config.model.arch == "gpt") {
    LoadedGPT student = load_gpt(checkpoint_file);
    LMSplits data = load_lm_splits(config);
    NoGradGuard no_grad;
    m = gpt_distill_eval(*student.model, *teacher.gpt, *data.val, B, 0, true, s);
    step = student.step;
  } else {
    LoadedBert student = load_bert(checkpoint_file);
    BertData data = load_bert_data(config);
    NoGradGuard no_grad;
    m = bert_distill_eval(*student.model, *teacher.bert, *data.val, uint64_t(config.seed), B,
                          bert_settings(config).eval_pairs, s);
    step = student.step;
  }
  print_eval(checkpoint_file.string(), step, m);
  return 0;
}

}  // namespace forge
