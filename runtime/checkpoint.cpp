// Checkpoint files on the HDF5 C API (layout: docs/checkpoint-format.md). HDF5 handles live in a
// small RAII wrapper so an error thrown half-way never leaks an open file; HDF5's own error stack
// printing is silenced so a user sees exactly one line from us (Error(checkpoint, "<file>: ...")).
#include "runtime/checkpoint.h"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "core/durable_file.h"
#include "core/isolate.h"
#include "data/hdf5_io.h"

namespace forge {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw Error(ExitCode::checkpoint, file.string() + ": " + what);
}

fs::path temp_path_for(const fs::path& file) { return fs::path(file.string() + ".tmp"); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// HDF5 plumbing.

namespace {

using hdf5::file_access_plist;
using hdf5::Hid;
using hdf5::quiet_hdf5;
using hdf5::read_attr_int;
using hdf5::read_attr_str;
using hdf5::write_attr_int;
using hdf5::write_attr_str;

/// Forge tensors have at most a handful of dimensions; HDF5 allows 32.
constexpr int kMaxRank = 8;

/// Everything about one HDF5 file needed to report errors against it.
struct H5File : hdf5::Reporter {
  Hid id;
  uint64_t file_size = 0;
};

/// Errors about a checkpoint file: exit 4, the path as given.
hdf5::Reporter checkpoint_file(const fs::path& file) {
  return {file.string(), ExitCode::checkpoint};
}

hid_t file_type(DType t) {
  switch (t) {
    case DType::f32: return H5T_IEEE_F32LE;
    case DType::f64: return H5T_IEEE_F64LE;
    case DType::bf16: return H5T_STD_U16LE;  // raw bfloat16 bits; the dtype attribute says so
    case DType::i64: return H5T_STD_I64LE;
  }
  return -1;
}

hid_t memory_type(DType t) {
  switch (t) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f64: return H5T_NATIVE_DOUBLE;
    case DType::bf16: return H5T_NATIVE_UINT16;
    case DType::i64: return H5T_NATIVE_INT64;
  }
  return -1;
}

std::optional<DType> parse_dtype(const std::string& s) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::i64})
    if (s == dtype_name(t)) return t;
  return std::nullopt;
}

Hid scalar_space() { return Hid(H5Screate(H5S_SCALAR), H5Sclose); }

/// Member names of a group, in creation order when the group tracks it (ours do), else by name.
std::vector<std::string> member_names(const H5File& f, hid_t group, const std::string& where) {
  H5G_info_t info;
  f.check(H5Gget_info(group, &info), "cannot list " + where);
  Hid gcpl(H5Gget_create_plist(group), H5Pclose);
  unsigned order_flags = 0;
  H5Pget_link_creation_order(gcpl.get(), &order_flags);
  H5_index_t index = (order_flags & H5P_CRT_ORDER_INDEXED) ? H5_INDEX_CRT_ORDER : H5_INDEX_NAME;
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    ssize_t n = H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (n < 0) f.fail("cannot list " + where);
    std::string name(size_t(n) + 1, '\0');
    H5Lget_name_by_idx(group, ".", index, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(size_t(n));
    names.push_back(std::move(name));
  }
  return names;
}

std::string dims_str(const std::vector<hsize_t>& dims) {
  std::string out = "[";
  for (size_t i = 0; i < dims.size(); ++i)
    out += (i ? ", " : "") + std::to_string((unsigned long long)dims[i]);
  return out + "]";
}

/// One stored tensor as far as it can be known without reading its data.
struct StoredSpec {
  TensorSpec spec;
  uint32_t crc = 0;
};

StoredSpec read_spec(const H5File& f, hid_t dataset, const std::string& where,
                     const std::string& name) {
  StoredSpec s;
  s.spec.name = name;
  std::string dtype_str = read_attr_str(f, dataset, "dtype", where);
  std::optional<DType> dtype = parse_dtype(dtype_str);
  if (!dtype) f.fail(where + " has unknown dtype '" + dtype_str + "'");
  s.spec.dtype = *dtype;
  Hid type(H5Dget_type(dataset), H5Tclose);
  H5T_class_t cls = H5Tget_class(type.get());
  bool is_float = *dtype == DType::f32 || *dtype == DType::f64;
  if (cls != (is_float ? H5T_FLOAT : H5T_INTEGER) || H5Tget_size(type.get()) != dtype_size(*dtype))
    f.fail(where + " is stored with an HDF5 type that does not match its dtype '" + dtype_str +
           "'");
  Hid space(H5Dget_space(dataset), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) f.fail("cannot read the shape of " + where);
  if (rank > kMaxRank)
    f.fail(where + " has rank " + std::to_string(rank) + " (at most " + std::to_string(kMaxRank) +
           " is plausible)");
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  // The declared size decides an allocation later, so it is checked here, overflow-safe, against
  // what the file can hold: Forge stores datasets contiguous and uncompressed.
  uint64_t nbytes = dtype_size(*dtype);
  for (hsize_t d : dims) {
    if (d != 0 && nbytes > f.file_size / d)
      f.fail(where + " declares shape " + dims_str(dims) + ", more bytes than the file's " +
             std::to_string(f.file_size));
    nbytes *= d;  // cannot overflow, and stays <= file_size, after the check above
    s.spec.shape.push_back(int64_t(d));
  }
  s.crc = uint32_t(read_attr_int(f, dataset, "crc32", where));
  return s;
}

std::vector<StoredSpec> read_group_specs(const H5File& f, const std::string& group,
                                         bool required) {
  htri_t exists = H5Lexists(f.id.get(), group.c_str(), H5P_DEFAULT);
  if (exists <= 0) {
    if (required) f.fail("missing group '" + group + "'");
    return {};
  }
  Hid g = f.check(H5Gopen2(f.id.get(), group.c_str(), H5P_DEFAULT), H5Gclose,
                  "cannot open group '" + group + "'");
  std::vector<StoredSpec> specs;
  for (const std::string& name : member_names(f, g.get(), "'" + group + "'")) {
    std::string where = "dataset '" + group + "/" + name + "'";
    // Parameter names are printed and matched against module paths: no writer of Forge's makes
    // one with control characters, so such a name is damage (or not a Forge file).
    if (printable(name) != name) f.fail(printable(where) + " has a name with control characters");
    Hid ds = f.check(H5Dopen2(g.get(), name.c_str(), H5P_DEFAULT), H5Dclose,
                     "cannot open " + where + " (corrupt, or not a dataset)");
    specs.push_back(read_spec(f, ds.get(), where, name));
  }
  return specs;
}

/// Reads a dataset's bytes into `dst` (spec.numel * dtype size bytes) and checks its CRC.
void read_dataset(const H5File& f, const std::string& group, const StoredSpec& s, void* dst) {
  std::string path = group + "/" + s.spec.name;
  std::string where = "dataset '" + path + "'";
  Hid ds = f.check(H5Dopen2(f.id.get(), path.c_str(), H5P_DEFAULT), H5Dclose,
                   "cannot open " + where);
  size_t nbytes = size_t(shape_numel(s.spec.shape)) * dtype_size(s.spec.dtype);
  if (nbytes > 0)
    f.check(H5Dread(ds.get(), memory_type(s.spec.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, dst),
            "cannot read " + where + " (corrupt file?)");
  uint32_t crc = crc32(dst, nbytes);
  if (crc != s.crc) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " (stored crc32 %08x, computed %08x)", unsigned(s.crc),
                  unsigned(crc));
    f.fail("checksum mismatch in " + where + buf + ": the file is corrupt");
  }
}

H5File open_for_read(const fs::path& file) {
  quiet_hdf5();
  std::error_code ec;
  if (!fs::exists(file, ec)) fail(file, "no such checkpoint file");
  if (fs::is_directory(file, ec)) fail(file, "is a directory, not a checkpoint file");
  // A file of Forge's own is checked against its digest before libhdf5 parses a byte of it; one
  // from elsewhere is read once in a throwaway process first (core/isolate.h).
  if (!check_sidecar_digest(file, ExitCode::checkpoint)) {
    if (std::optional<std::string> crash = probe_file_once(file, [&] { verify_checkpoint(file); }))
      fail(file, "the HDF5 library crashed reading it (" + *crash + "): the file is corrupt");
  }
  uint64_t file_size = fs::file_size(file, ec);
  if (ec) fail(file, "cannot stat: " + ec.message());
  if (H5Fis_hdf5(file.c_str()) <= 0) fail(file, "not an HDF5 file (truncated or overwritten?)");
  Hid fapl = file_access_plist();
  hid_t id = H5Fopen(file.c_str(), H5F_ACC_RDONLY, fapl.get());
  if (id < 0) fail(file, "cannot open as HDF5 (truncated or corrupt file)");
  return H5File{checkpoint_file(file), Hid(id, H5Fclose), file_size};
}

/// Root attributes (all required), and the config checksum, which HDF5's own metadata checksums
/// do not cover (variable-length strings live in the unchecksummed global heap). The tensor count
/// /auxiliary records for each auxiliary model goes to `auxiliary_tensors`.
CheckpointInfo read_header(const H5File& f, std::map<std::string, int64_t>& auxiliary_tensors) {
  hid_t root = f.id.get();
  CheckpointInfo info;
  info.format_version = read_attr_int(f, root, "format_version", "/");
  if (info.format_version > kCheckpointFormatVersion)
    f.fail("format_version " + std::to_string(info.format_version) +
           " is newer than this build of forge reads (" +
           std::to_string(kCheckpointFormatVersion) + "); upgrade forge");
  if (info.format_version < 1)
    f.fail("unknown format_version " + std::to_string(info.format_version));
  info.step = read_attr_int(f, root, "step", "/");
  if (info.step < 0) f.fail("negative step " + std::to_string(info.step));
  info.config_yaml = read_attr_str(f, root, "config", "/");
  info.forge_version = read_attr_str(f, root, "forge_version", "/");
  uint32_t stored = uint32_t(read_attr_int(f, root, "config_crc32", "/"));
  if (crc32(info.config_yaml.data(), info.config_yaml.size()) != stored)
    f.fail("checksum mismatch in attribute 'config': the file is corrupt");
  // A group under the root and the names of its attributes.
  auto open_group = [&](const std::string& name, std::vector<std::string>& names) {
    Hid g = f.check(H5Gopen2(root, name.c_str(), H5P_DEFAULT), H5Gclose,
                    "cannot open group '/" + name + "'");
    auto collect = [](hid_t, const char* attr, const H5A_info_t*, void* out) -> herr_t {
      static_cast<std::vector<std::string>*>(out)->push_back(attr);
      return 0;
    };
    f.check(H5Aiterate2(g.get(), H5_INDEX_NAME, H5_ITER_INC, nullptr, collect, &names),
            "cannot list attributes of '/" + name + "'");
    return g;
  };
  if (H5Lexists(root, "counters", H5P_DEFAULT) <= 0) f.fail("missing group '/counters'");
  std::vector<std::string> names;
  Hid g = open_group("counters", names);
  for (const std::string& name : names)
    info.counters[name] = read_attr_int(f, g.get(), name, "'/counters'");
  // Written by runs that reference models they do not save; absent in older checkpoints.
  if (H5Lexists(root, "references", H5P_DEFAULT) > 0) {
    names.clear();
    Hid r = open_group("references", names);
    for (const std::string& name : names) {
      size_t dot = name.rfind('.');
      std::string model = dot == std::string::npos ? "" : name.substr(0, dot);
      std::string field = dot == std::string::npos ? name : name.substr(dot + 1);
      std::string value = read_attr_str(f, r.get(), name, "'/references'");
      if (field == "path")
        info.references[model].path = value;
      else if (field == "digest")
        info.references[model].digest = value;
      else
        f.fail("unexpected attribute '" + name + "' in '/references'");
    }
    for (const auto& [model, ref] : info.references)
      if (ref.path.empty() || ref.digest.empty())
        f.fail("reference '" + model + "' in '/references' lacks its path or digest");
  }
  // Written by runs that train models besides the main one; absent otherwise.
  if (H5Lexists(root, "auxiliary", H5P_DEFAULT) > 0) {
    names.clear();
    Hid a = open_group("auxiliary", names);
    for (const std::string& name : names) {
      if (name.empty() || name.find('.') != std::string::npos)
        f.fail("invalid auxiliary model name '" + name + "' in '/auxiliary'");
      info.auxiliary.push_back(name);
      auxiliary_tensors[name] = read_attr_int(f, a.get(), name, "'/auxiliary'");
    }
  }
  return info;
}

// Each auxiliary model holds as many tensors under /model as /auxiliary records for it.
void check_auxiliary(const H5File& f, const CheckpointInfo& info,
                     const std::map<std::string, int64_t>& auxiliary_tensors,
                     const std::vector<StoredSpec>& model) {
  for (const std::string& name : info.auxiliary) {
    int64_t n = 0;
    for (const StoredSpec& s : model) n += is_auxiliary_tensor({name}, s.spec.name);
    if (n != auxiliary_tensors.at(name))
      f.fail("'/auxiliary' records " + std::to_string(auxiliary_tensors.at(name)) +
             " tensors of model '" + name + "', '/model' holds " + std::to_string(n));
  }
}

std::vector<TensorSpec> plain_specs(const std::vector<StoredSpec>& stored) {
  std::vector<TensorSpec> out;
  for (const StoredSpec& s : stored) out.push_back(s.spec);
  return out;
}

/// Compares stored tensors with the caller's expectation and names the first difference: walking
/// the expected list first (missing, shape, dtype), then what the file has in excess.
void check_specs(const H5File& f, const std::string& what, const std::vector<StoredSpec>& stored,
                 const std::vector<TensorSpec>& expected) {
  std::map<std::string, const TensorSpec*> by_name;
  for (const StoredSpec& s : stored) by_name[s.spec.name] = &s.spec;
  std::set<std::string> expected_names;
  std::vector<std::string> problems;
  for (const TensorSpec& e : expected) {
    FORGE_CHECK(expected_names.insert(e.name).second, "load_checkpoint: ", what, " '", e.name,
                "' is listed twice in the expected specs");
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      problems.push_back(what + " '" + e.name + "' is missing from the checkpoint");
    } else if (it->second->shape != e.shape) {
      problems.push_back(what + " '" + e.name + "' has shape " + shape_str(it->second->shape) +
                         " in the checkpoint but " + shape_str(e.shape) + " is expected");
    } else if (it->second->dtype != e.dtype) {
      problems.push_back(what + " '" + e.name + "' is " + dtype_name(it->second->dtype) +
                         " in the checkpoint but " + dtype_name(e.dtype) + " is expected");
    }
  }
  for (const StoredSpec& s : stored)
    if (!expected_names.count(s.spec.name))
      problems.push_back("unexpected " + what + " '" + s.spec.name +
                         "' in the checkpoint (not expected by this model/config)");
  if (problems.empty()) return;
  std::string line = problems.front();
  if (problems.size() > 1)
    line += " (" + std::to_string(problems.size() - 1) + " more mismatch" +
            (problems.size() > 2 ? "es" : "") + "; was it written with a different config?)";
  f.fail(line);
}

/// Reads the tensors of `group` in the order of `specs` (already validated), each handed to `take`
/// instead of kept when it is set.
NamedTensors read_tensors(
    const H5File& f, const std::string& group, const std::vector<StoredSpec>& stored,
    const std::vector<TensorSpec>& order,
    const std::function<void(size_t, Tensor)>& take = nullptr) {
  std::map<std::string, const StoredSpec*> by_name;
  for (const StoredSpec& s : stored) by_name[s.spec.name] = &s;
  NamedTensors out;
  for (size_t i = 0; i < order.size(); ++i) {
    const StoredSpec& s = *by_name.at(order[i].name);
    Tensor t = empty(s.spec.shape, s.spec.dtype);
    read_dataset(f, group, s, t.raw_data());
    if (take)
      take(i, std::move(t));
    else
      out.push_back({order[i].name, t});
  }
  return out;
}

// Names become HDF5 link names: a '/' would silently nest groups, "." names the group itself.
void check_names(const NamedTensors& tensors, const char* group) {
  std::set<std::string> seen;
  for (const NamedTensor& nt : tensors) {
    FORGE_CHECK(!nt.name.empty() && nt.name != "." && nt.name.find('/') == std::string::npos,
                "save_checkpoint: invalid ", group, " tensor name '", nt.name,
                "' (must be non-empty and contain no '/')");
    FORGE_CHECK(seen.insert(nt.name).second, "save_checkpoint: duplicate ", group,
                " tensor name '", nt.name, "'");
    FORGE_CHECK(nt.tensor.defined(), "save_checkpoint: ", group, " tensor '", nt.name,
                "' is undefined");
  }
}

Hid create_group(const H5File& f, const std::string& group) {
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_link_creation_order(gcpl.get(), H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED);
  return f.check(H5Gcreate2(f.id.get(), group.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT),
                 H5Gclose, "cannot create group '" + group + "'");
}

void write_dataset(const H5File& f, const Hid& g, const std::string& group,
                   const NamedTensor& nt) {
  std::string where = "dataset '" + group + "/" + nt.name + "'";
  Tensor c = nt.tensor.detach().contiguous();
  std::vector<hsize_t> dims;
  for (int64_t d : c.shape()) dims.push_back(hsize_t(d));
  Hid space = dims.empty() ? scalar_space()
                           : Hid(H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                                 H5Sclose);
  Hid ds = f.check(H5Dcreate2(g.get(), nt.name.c_str(), file_type(c.dtype()), space.get(),
                              H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose, "cannot create " + where);
  size_t nbytes = size_t(c.numel()) * dtype_size(c.dtype());
  if (nbytes > 0)
    f.check(H5Dwrite(ds.get(), memory_type(c.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                     c.raw_data()),
            "cannot write " + where + " (disk full?)");
  write_attr_str(f, ds.get(), "dtype", dtype_name(c.dtype()));
  write_attr_int(f, ds.get(), "crc32", H5T_STD_U32LE, crc32(c.raw_data(), nbytes));
}

void write_group(const H5File& f, const std::string& group, const NamedTensors& tensors) {
  Hid g = create_group(f, group);
  for (const NamedTensor& nt : tensors) write_dataset(f, g, group, nt);
}

void write_checkpoint_file(const fs::path& file, const CheckpointData& data) {
  Hid fapl = file_access_plist();
  // Exclusive: a file (or a symlink) already at the temp name is never truncated or followed.
  hid_t id = H5Fcreate(file.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get());
  if (id < 0)
    fail(file, "cannot create checkpoint file (it exists? directory writable? disk full?)");
  H5File f{checkpoint_file(file), Hid(id, H5Fclose)};
  hid_t root = f.id.get();
  write_attr_int(f, root, "format_version", H5T_STD_I64LE, kCheckpointFormatVersion);
  write_attr_int(f, root, "step", H5T_STD_I64LE, data.step);
  write_attr_str(f, root, "config", data.config_yaml);
  write_attr_int(f, root, "config_crc32", H5T_STD_U32LE,
                 crc32(data.config_yaml.data(), data.config_yaml.size()));
  write_attr_str(f, root, "forge_version", kForgeVersion);
  {
    Hid g = f.check(H5Gcreate2(root, "counters", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose,
                    "cannot create group '/counters'");
    for (const auto& [key, value] : data.counters)
      write_attr_int(f, g.get(), key, H5T_STD_I64LE, value);
  }
  if (!data.references.empty()) {
    Hid g = f.check(H5Gcreate2(root, "references", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    H5Gclose, "cannot create group '/references'");
    for (const auto& [model, ref] : data.references) {
      FORGE_CHECK(!model.empty() && model.find('.') == std::string::npos,
                  "save_checkpoint: invalid reference name '", model, "'");
      write_attr_str(f, g.get(), model + ".path", ref.path);
      write_attr_str(f, g.get(), model + ".digest", ref.digest);
    }
  }
  if (!data.auxiliary.empty()) {
    Hid g = f.check(H5Gcreate2(root, "auxiliary", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    H5Gclose, "cannot create group '/auxiliary'");
    for (const std::string& model : data.auxiliary) {
      FORGE_CHECK(!model.empty() && model.find('.') == std::string::npos,
                  "save_checkpoint: invalid auxiliary model name '", model, "'");
      int64_t tensors = 0;
      for (const NamedTensor& t : data.model) tensors += is_auxiliary_tensor({model}, t.name);
      write_attr_int(f, g.get(), model, H5T_STD_I64LE, tensors);
    }
  }
  write_group(f, "/model", data.model);
  if (data.optim_stream) {
    Hid g = create_group(f, "/optim");
    std::set<std::string> seen;
    data.optim_stream([&](const NamedTensor& nt) {
      check_names({nt}, "optim");
      FORGE_CHECK(seen.insert(nt.name).second, "save_checkpoint: duplicate optim tensor name '",
                  nt.name, "'");
      write_dataset(f, g, "/optim", nt);
    });
  } else {
    write_group(f, "/optim", data.optim);
  }
  f.check(H5Fflush(root, H5F_SCOPE_GLOBAL), "cannot flush checkpoint (disk full?)");
}

/// Step files of a checkpoints directory, oldest first. Temp files and anything else are ignored.
std::vector<std::pair<int64_t, fs::path>> step_files(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() < 9 || name.rfind("step-", 0) != 0 || !name.ends_with(".h5")) continue;
    std::string digits = name.substr(5, name.size() - 8);
    if (digits.empty() || digits.size() > 18 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    out.push_back({std::stoll(digits), e.path()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// LATEST's line: "<file name> <digest>", or just the file name (written before digests existed).
struct Latest {
  std::string name;
  std::string digest;
};

Latest read_latest(const fs::path& dir) {
  std::string line = read_first_line(dir / "LATEST");
  size_t space = line.find(' ');
  if (space == std::string::npos) return {line, ""};
  return {line.substr(0, space), line.substr(space + 1)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API.

std::vector<TensorSpec> specs_of(const NamedTensors& tensors) {
  std::vector<TensorSpec> out;
  for (const NamedTensor& nt : tensors)
    out.push_back({nt.name, nt.tensor.shape(), nt.tensor.dtype()});
  return out;
}

int64_t CheckpointInfo::model_numel() const {
  int64_t n = 0;
  for (const TensorSpec& s : model) n += shape_numel(s.shape);
  return n;
}

std::vector<TensorSpec> CheckpointInfo::main_model() const {
  std::vector<TensorSpec> out;
  for (const TensorSpec& s : model)
    if (!is_auxiliary_tensor(auxiliary, s.name)) out.push_back(s);
  return out;
}

int64_t CheckpointInfo::main_model_numel() const {
  int64_t n = 0;
  for (const TensorSpec& s : main_model()) n += shape_numel(s.shape);
  return n;
}

bool is_auxiliary_tensor(const std::vector<std::string>& auxiliary, const std::string& name) {
  return std::any_of(auxiliary.begin(), auxiliary.end(),
                     [&](const std::string& m) { return name.rfind(m + ".", 0) == 0; });
}

int64_t CheckpointInfo::optim_numel() const {
  int64_t n = 0;
  for (const TensorSpec& s : optim) n += shape_numel(s.shape);
  return n;
}

fs::path checkpoint_path(const fs::path& run_dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%06lld.h5", static_cast<long long>(step));
  return run_dir / "checkpoints" / name;
}

namespace {

void check_checkpoint_data(const CheckpointData& data) {
  FORGE_CHECK(data.step >= 0, "save_checkpoint: negative step ", data.step);
  check_names(data.model, "model");
  check_names(data.optim, "optim");
  for (const auto& [key, value] : data.counters)
    FORGE_CHECK(!key.empty(), "save_checkpoint: empty counter name");
}

// Temp file `tmp`, fsync, rename, fsync of the directory: `file` is the old one or the new one.
void write_checkpoint_durably(const fs::path& file, const fs::path& tmp,
                              const CheckpointData& data) {
  std::error_code ec;
  try {
    write_checkpoint_file(tmp, data);  // closes the file before returning
    fsync_path(tmp, false, ExitCode::checkpoint);
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  rename_durably(tmp, file, ExitCode::checkpoint);
  write_digest_sidecar(file, ExitCode::checkpoint);
}

}  // namespace

void save_checkpoint_file(const fs::path& file, const CheckpointData& data) {
  quiet_hdf5();
  check_checkpoint_data(data);
  // Outside a run directory nothing clears leftovers: the temp name is this process's own.
  write_checkpoint_durably(file, fs::path(file.string() + ".tmp." + std::to_string(::getpid())),
                           data);
}

fs::path save_checkpoint(const fs::path& run_dir, const CheckpointData& data, int keep_last) {
  quiet_hdf5();
  check_checkpoint_data(data);

  fs::path dir = run_dir / "checkpoints";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail(dir, "cannot create directory: " + ec.message());
  // Leftovers of a save that crashed: never valid, never looked at, safe to drop.
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() == ".tmp" || name.find(".tmp.") != std::string::npos)
      fs::remove(e.path(), ec);
  }

  fs::path file = checkpoint_path(run_dir, data.step);
  write_checkpoint_durably(file, temp_path_for(file), data);
  write_file_atomic(dir / "LATEST",
                    file.filename().string() + " " + read_first_line(digest_path(file)) + "\n",
                    ExitCode::checkpoint);

  if (keep_last > 0) {
    auto files = step_files(dir);
    size_t excess = files.size() > size_t(keep_last) ? files.size() - size_t(keep_last) : 0;
    for (size_t i = 0; i < files.size() && excess > 0; ++i) {
      if (files[i].second.filename() == file.filename()) continue;
      fs::remove(digest_path(files[i].second), ec);
      fs::remove(files[i].second, ec);
      --excess;
    }
  }
  return file;
}

namespace {

std::vector<ForeignLayout>& foreign_layouts() {
  static std::vector<ForeignLayout> layouts;
  return layouts;
}

}  // namespace

void install_foreign_layout(ForeignLayout layout) {
  foreign_layouts().push_back(std::move(layout));
}

const ForeignLayout* foreign_layout(const fs::path& path) {
  for (const ForeignLayout& layout : foreign_layouts())
    if (layout.detects(path)) return &layout;
  return nullptr;
}

std::string checkpoint_digest(const fs::path& source) {
  const ForeignLayout* foreign = foreign_layout(source);
  if (!foreign) return file_digest(source, ExitCode::checkpoint);
  // One file keeps the plain digest, so references written before sharding stay valid.
  std::string digest;
  for (const fs::path& file : foreign->weights_files(source))
    digest += (digest.empty() ? "" : "+") + file_digest(file, ExitCode::checkpoint);
  return digest;
}

void verify_checkpoint(const fs::path& file) {
  if (const ForeignLayout* foreign = foreign_layout(file)) return foreign->verify(file);
  H5File f = open_for_read(file);
  std::map<std::string, int64_t> auxiliary_tensors;
  CheckpointInfo info = read_header(f, auxiliary_tensors);
  check_auxiliary(f, info, auxiliary_tensors, read_group_specs(f, "/model", true));
  std::vector<unsigned char> buffer;
  for (const char* group : {"/model", "/optim"}) {
    for (const StoredSpec& s : read_group_specs(f, group, std::string(group) == "/model")) {
      buffer.resize(size_t(shape_numel(s.spec.shape)) * dtype_size(s.spec.dtype));
      read_dataset(f, group, s, buffer.data());
    }
  }
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir, std::string* warning) {
  fs::path dir = run_dir / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  std::string why;  // why LATEST could not be used
  auto [latest, latest_digest] = read_latest(dir);
  if (!latest.empty() && latest.find('/') == std::string::npos) {
    try {
      if (!latest_digest.empty())
        check_digest(dir / latest, latest_digest, (dir / "LATEST").string(), ExitCode::checkpoint);
      verify_checkpoint(dir / latest);
      return dir / latest;
    } catch (const Error& e) {
      why = e.what();
    }
  } else if (fs::exists(dir / "LATEST", ec)) {
    why = (dir / "LATEST").string() + ": does not name a checkpoint file";
  } else {
    why = (dir / "LATEST").string() + ": missing";
  }
  auto files = step_files(dir);
  std::vector<std::string> failures;
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    if (it->second.filename() == latest) continue;  // already tried
    try {
      verify_checkpoint(it->second);
    } catch (const Error& e) {
      failures.push_back(e.what());
      continue;
    }
    if (warning) *warning = why + "; using " + it->second.filename().string() + " instead";
    return it->second;
  }
  if (!latest.empty() || !files.empty())
    throw Error(ExitCode::checkpoint,
                dir.string() + ": no intact checkpoint (" + why +
                    (failures.empty() ? "" : "; " + failures.front()) +
                    "); delete the directory or set train.resume: never");
  return std::nullopt;
}

bool is_checkpoint_file(const fs::path& path) {
  static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, sizeof head) && std::equal(head, head + 8, kSignature);
}

CheckpointInfo read_checkpoint_info(const fs::path& file) {
  if (const ForeignLayout* foreign = foreign_layout(file)) return foreign->read_info(file);
  H5File f = open_for_read(file);
  std::map<std::string, int64_t> auxiliary_tensors;
  CheckpointInfo info = read_header(f, auxiliary_tensors);
  std::vector<StoredSpec> model = read_group_specs(f, "/model", true);
  check_auxiliary(f, info, auxiliary_tensors, model);
  info.model = plain_specs(model);
  info.optim = plain_specs(read_group_specs(f, "/optim", false));
  return info;
}

CheckpointData load_checkpoint(const fs::path& file, const std::vector<TensorSpec>& expected_model,
                               const LoadOptions& options) {
  if (const ForeignLayout* foreign = foreign_layout(file))
    return foreign->load(file, expected_model, options);
  H5File f = open_for_read(file);
  std::map<std::string, int64_t> auxiliary_tensors;
  CheckpointInfo info = read_header(f, auxiliary_tensors);
  std::vector<StoredSpec> model = read_group_specs(f, "/model", true);
  check_auxiliary(f, info, auxiliary_tensors, model);
  std::set<std::string> expected_names;
  for (const TensorSpec& e : expected_model) expected_names.insert(e.name);
  std::erase_if(model, [&](const StoredSpec& s) {
    return is_auxiliary_tensor(info.auxiliary, s.spec.name) && !expected_names.count(s.spec.name);
  });
  if (options.model_subset)
    std::erase_if(model, [&](const StoredSpec& s) { return !expected_names.count(s.spec.name); });
  check_specs(f, "model parameter", model, expected_model);
  std::vector<StoredSpec> optim;
  std::vector<TensorSpec> optim_order;
  if (options.load_optim) {
    // Resuming from a file without `/optim` would silently restart the optimizer's moments.
    optim = read_group_specs(f, "/optim", true);
    if (options.expected_optim) {
      check_specs(f, "optimizer state", optim, *options.expected_optim);
      optim_order = *options.expected_optim;
    } else {
      optim_order = plain_specs(optim);
    }
  }
  CheckpointData data;
  data.step = info.step;
  data.config_yaml = std::move(info.config_yaml);
  data.counters = std::move(info.counters);
  data.references = std::move(info.references);
  data.auxiliary = std::move(info.auxiliary);
  data.model = read_tensors(f, "/model", model, expected_model, options.take_model_tensor);
  data.optim = read_tensors(f, "/optim", optim, optim_order);
  return data;
}

}  // namespace forge
