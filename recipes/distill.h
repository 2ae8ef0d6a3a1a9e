// Recipe distill: a smaller GPT or BERT (the student, model:) trained from a frozen teacher of the
// same family and vocabulary (distill.teacher) with hard-label cross-entropy, temperature-scaled KL
// to the teacher's distribution and a cosine loss on the final hidden states, optionally starting
// from the teacher's own layers (DistilBERT). docs/recipes/distill.md.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "nn/module.h"
#include "runtime/components.h"
#include "runtime/config.h"
#include "runtime/registry.h"

namespace forge {

/// distill for the registry.
RecipeSpec distill_recipe();

/// The `distill:` section: the teacher, the student's initialisation and the loss weights.
ConfigSection distill_section();

/// distill.init_from_teacher: where the student's blocks start on a fresh run.
enum class TeacherInit { none, every_other, blocks };

/// The distill: section, a field a key of distill_section (its docs and defaults are there).
struct DistillSection {
  std::string teacher;
  TeacherInit init_from_teacher{};
  std::vector<int64_t> teacher_blocks;
  double temperature{};
  double alpha_ce{};
  double alpha_kd{};
  double alpha_cos{};
  bool reverse_kl{};  ///< distill.kl: reverse
};
/// What `config` says in its distill: section.
DistillSection distill_settings(const RunConfig& config);

/// Trains per `config` (the run directory of README.md); returns the process exit code.
int train_distill(const RunConfig& config);

/// `forge eval` for a distill run: the student's validation metrics (as its family's pretraining
/// recipe reports them), the teacher's loss on the same data and their top-1 agreement.
int eval_distill(const RunConfig& config, const std::filesystem::path& checkpoint_file,
                 const CommandOptions& options = {});

/// The teacher block each student block starts from under distill.init_from_teacher: none (empty),
/// every_other (0, 2, 4, ...) or blocks (distill.teacher_blocks). Error(usage) naming the key
/// when a block is not in a teacher of `teacher_layers` blocks.
std::vector<int64_t> teacher_blocks_for_student(const RunConfig& config, int64_t teacher_layers);

/// Copies the teacher's checkpoint into `student`: teacher block blocks[s] into student block s,
/// every tensor outside the blocks (embeddings, final norm, heads) by its name; the other teacher
/// blocks are not read. Error(checkpoint) naming the file and the tensor when a shape differs or a
/// tensor's block is not one of the model.n_layers blocks the teacher's stored config declares.
InitReport init_student_from_teacher(nn::Module& student, const std::filesystem::path& teacher_file,
                                     const std::vector<int64_t>& blocks);

}  // namespace forge
