// Checkpoints: one HDF5 file per save under <run dir>/checkpoints/, plus LATEST naming the newest
// complete one (layout: docs/checkpoint-format.md). Files are written to a temp name, fsynced and
// renamed, so a crash at any instant leaves the previous checkpoint loadable. A whole-file digest
// kept beside each file is checked before HDF5 parses it; loading checks declared sizes against the
// file, then names, shapes and dtypes before reading any tensor data, and every dataset carries a
// CRC32 that is verified on load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/named_tensor.h"

namespace forge {

/// Version of the checkpoint layout this build writes and reads.
inline constexpr int64_t kCheckpointFormatVersion = 1;
/// Stored in every checkpoint as `forge_version`, for humans reading a file later.
inline constexpr const char* kForgeVersion = "0.1.0";

/// A model a run used but did not save (a frozen teacher or reference, or the base under LoRA
/// adapters): where it was loaded from and the digest of that file when it was (file_digest).
struct ModelReference {
  std::string path;
  std::string digest;
  bool operator==(const ModelReference&) const = default;
};

/// What a checkpoint holds. Counters carry the integer state a resume needs besides tensors
/// (generator seed/stream/offset, data cursor, ...); unsigned values are stored by bit pattern.
struct CheckpointData {
  int64_t step = 0;
  std::string config_yaml;
  NamedTensors model;
  NamedTensors optim;
  /// Instead of `optim` (then empty), for a state not held whole anywhere (a sharded optimizer
  /// gathers it from the ranks, docs/distributed.md): the writer calls it once with a function
  /// that writes one tensor, to be called for every tensor in order; each may be freed after.
  std::function<void(const std::function<void(const NamedTensor&)>& write)> optim_stream;
  std::map<std::string, int64_t> counters;
  /// By model name ("model" for the run's main model); stored under /references.
  std::map<std::string, ModelReference> references;
  /// Trained models saved beside the main one (a distillation's cos_projection), their tensors in
  /// `model` as "<name>.<tensor>"; stored under /auxiliary.
  std::vector<std::string> auxiliary;
};

/// A tensor's name, shape and dtype: what a caller expects a checkpoint to contain.
struct TensorSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  bool operator==(const TensorSpec&) const = default;
};

/// The specs of a list of named tensors (e.g. a model's parameters), in the same order.
std::vector<TensorSpec> specs_of(const NamedTensors& tensors);

/// Everything in a checkpoint except tensor data (for `forge inspect` and for building a model
/// from the stored config before loading it).
struct CheckpointInfo {
  int64_t format_version = 0;
  int64_t step = 0;
  std::string config_yaml;
  std::string forge_version;
  std::map<std::string, int64_t> counters;
  std::map<std::string, ModelReference> references;
  std::vector<std::string> auxiliary;
  std::vector<TensorSpec> model;  // in the order they were saved
  std::vector<TensorSpec> optim;
  int64_t model_numel() const;
  int64_t optim_numel() const;
  /// The tensors of the main model: `model` without those of the auxiliary models.
  std::vector<TensorSpec> main_model() const;
  int64_t main_model_numel() const;
};

/// Whether tensor `name` belongs to one of the `auxiliary` models ("<model>.<tensor>").
bool is_auxiliary_tensor(const std::vector<std::string>& auxiliary, const std::string& name);

/// What load_checkpoint checks and reads besides the model.
struct LoadOptions {
  /// Read `/optim`, which must then exist (needed to resume training; generate and eval set this
  /// false).
  bool load_optim = true;
  /// When given, `/optim` must hold exactly these tensors (same checks as the model).
  std::optional<std::vector<TensorSpec>> expected_optim;
  /// The checkpoint may hold model tensors besides `expected_model` (initialising a model from part
  /// of another one); they are not read.
  bool model_subset = false;
  /// When set, each model tensor goes to it as soon as it is read, with its index in
  /// expected_model, and is not kept (CheckpointData::model stays empty): loading into a model then
  /// holds one tensor of the file at a time, not a second copy of the model.
  std::function<void(size_t index, Tensor tensor)> take_model_tensor;
};

/// A layout of another tool's models (a Hugging Face directory) that every checkpoint reader takes
/// as a step-0 checkpoint under Forge's names. formats/ defines them and a program installs them
/// at start (cli/main.cpp, tests/main.cpp), so the runtime reads them without depending on formats/.
struct ForeignLayout {
  std::string name;                                           // "Hugging Face directory"
  std::function<bool(const std::filesystem::path&)> detects;  // cheap: file names only
  std::function<CheckpointInfo(const std::filesystem::path&)> read_info;
  std::function<CheckpointData(const std::filesystem::path&, const std::vector<TensorSpec>&,
                               const LoadOptions&)>
      load;
  std::function<void(const std::filesystem::path&)> verify;
  /// The files whose digests stand for the model (checkpoint_digest): every file a change of the
  /// weights would touch.
  std::function<std::vector<std::filesystem::path>(const std::filesystem::path&)> weights_files;
};

/// Adds a layout that read_checkpoint_info, load_checkpoint, verify_checkpoint, checkpoint_digest
/// and resolve_checkpoint accept.
void install_foreign_layout(ForeignLayout layout);

/// The installed layout that detects `path`, or nullptr (a Forge checkpoint or no model at all).
const ForeignLayout* foreign_layout(const std::filesystem::path& path);

/// `<run_dir>/checkpoints/step-000200.h5` for step 200.
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step);

/// Writes `<run_dir>/checkpoints/step-%06d.h5` and its digest sidecar atomically and durably, points
/// LATEST at it (name and digest), then
/// deletes the oldest step files beyond `keep_last` (never the one LATEST names; keep_last <= 0
/// keeps all). Returns the file written. Throws Error(checkpoint) if the disk refuses.
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir,
                                      const CheckpointData& data, int keep_last);

/// Writes one checkpoint file at `file` (e.g. `forge export`) and its digest sidecar, atomically and
/// durably as above.
void save_checkpoint_file(const std::filesystem::path& file, const CheckpointData& data);

/// The newest complete, intact checkpoint of a run: the one LATEST names, or when LATEST is
/// missing or names a missing/corrupt file, the newest step file that verifies. Temp files of an
/// interrupted save are ignored. nullopt when the run has none. When a fallback was needed and
/// `warning` is given, it receives one line saying why.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir,
                                                       std::string* warning = nullptr);

/// Reads a checkpoint (or a model in an installed foreign layout: a Hugging Face directory). Names, shapes and dtypes of `/model` must match `expected_model` exactly
/// (checked before any data is read), except that tensors of auxiliary models the caller does not
/// expect are left unread; the returned model tensors follow `expected_model`'s order.
/// Any problem (not HDF5, truncated, checksum mismatch, missing attribute, missing/unexpected
/// parameter, shape or dtype mismatch, newer format) throws Error(checkpoint, "<file>: ...").
CheckpointData load_checkpoint(const std::filesystem::path& file,
                               const std::vector<TensorSpec>& expected_model,
                               const LoadOptions& options = {});

/// Whether `path` is a regular file that starts with HDF5's signature, as every checkpoint Forge
/// writes does: how a command that takes a config or a checkpoint tells them apart. Reads 8 bytes.
bool is_checkpoint_file(const std::filesystem::path& path);

/// Step, config, counters and tensor specs, without reading tensor data.
CheckpointInfo read_checkpoint_info(const std::filesystem::path& file);

/// file_digest of a checkpoint file, or of a Hugging Face directory's weights (model.safetensors):
/// what a reference to a model that a run used but did not save records.
std::string checkpoint_digest(const std::filesystem::path& source);

/// Reads every dataset and checks its checksum (and the metadata checksum); throws
/// Error(checkpoint, "<file>: ...") on the first problem.
void verify_checkpoint(const std::filesystem::path& file);

}  // namespace forge
