// The HDF5 plumbing of token datasets (data/) and checkpoints (runtime/), written once: RAII for
// identifiers, the switch that keeps HDF5 from printing its own error stack (users see Forge's
// one-line errors), the file-access settings, and checked scalar attribute reads and writes whose
// errors name the file and attribute with the exit class of the caller's kind of file.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "core/error.h"

namespace forge::hdf5 {

/// Cheap; called at every entry point because H5Eset_auto2 is per-thread in thread-safe builds.
/// The first call, before HDF5 initialises, also turns off HDF5's exit-time teardown: it closes
/// every file still open, and crashes on one whose close failed (a full disk); Hid closes every
/// handle Forge opens, so the teardown has nothing else to do.
inline void quiet_hdf5() {
  static const bool no_teardown = H5dont_atexit() >= 0;
  (void)no_teardown;
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

/// Owns one identifier and closes it with the matching H5?close.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }

  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }
  /// Gives up ownership (the caller closes it).
  hid_t release() {
    hid_t id = id_;
    id_ = -1;
    return id;
  }
  void reset() {
    if (id_ >= 0) close_(id_);
    id_ = -1;
  }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

/// The value of string attribute `attr`, which must hold one string (a scalar or one-element
/// dataspace: H5Aread writes every element, so more would overrun the buffer), fixed-length (at
/// most `max_fixed` bytes, NULLPAD as h5py writes np.bytes_ or NULLTERM) or variable-length.
/// Otherwise nullopt with `problem` saying why; a corrupt file never sizes an allocation beyond
/// max_fixed + 1 bytes (fixed-length attributes live in the 64 KiB object header, so a larger
/// size is damage).
std::optional<std::string> read_string_attr(hid_t attr, std::string& problem,
                                            size_t max_fixed = size_t(1) << 16);

/// The file errors are about: each is Error(code, "<name>: <what>"), `name` as the caller prints
/// the path (checkpoints as given, token datasets through quoted_path).
struct Reporter {
  std::string name;
  ExitCode code = ExitCode::internal;
  [[noreturn]] void fail(const std::string& what) const;
  /// Owns `id`, or fails with `what` when HDF5 returned an error for it.
  Hid check(hid_t id, herr_t (*close)(hid_t), const std::string& what) const;
  void check(herr_t rc, const std::string& what) const;
};

/// File-access properties for every file Forge creates or opens: 1.8 object headers (checksummed)
/// and no file locking.
Hid file_access_plist();

/// Attribute `name` of `obj`, a scalar integer stored as `file_type` (H5T_STD_I64LE, _U32LE...).
void write_attr_int(const Reporter& file, hid_t obj, const std::string& name, hid_t file_type,
                    int64_t value);
/// Attribute `name` of `obj`, a variable-length UTF-8 string.
void write_attr_str(const Reporter& file, hid_t obj, const std::string& name,
                    const std::string& value);

/// The integer attribute `name` of `obj`; fails naming it (and " on <where>" when `where` is not
/// empty) when it is missing, not one integer, or unreadable.
int64_t read_attr_int(const Reporter& file, hid_t obj, const std::string& name,
                      const std::string& where = "");
/// The string attribute `name` of `obj`, read by read_string_attr; fails as read_attr_int does.
std::string read_attr_str(const Reporter& file, hid_t obj, const std::string& name,
                          const std::string& where = "");

}  // namespace forge::hdf5
