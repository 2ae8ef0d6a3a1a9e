// RAII for HDF5 identifiers, shared by token datasets (data/) and checkpoints (recipes/), and the
// switch that keeps HDF5 from printing its own error stack (users see Forge's one-line errors).
#pragma once

#include <hdf5.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>

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
/// max_fixed + 1 bytes.
inline std::optional<std::string> read_string_attr(hid_t attr, std::string& problem,
                                                   size_t max_fixed = size_t(1) << 16) {
  Hid type(H5Aget_type(attr), H5Tclose);
  Hid space(H5Aget_space(attr), H5Sclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
    problem = "is not a string";
    return std::nullopt;
  }
  if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    problem = "is not a single string";
    return std::nullopt;
  }
  Hid mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* p = nullptr;
    if (H5Aread(attr, mem.get(), &p) < 0) {
      problem = "cannot be read";
      return std::nullopt;
    }
    std::string value = p ? p : "";
    H5free_memory(p);
    return value;
  }
  // NULLPAD strings fill all `size` bytes with no terminator: the memory type gets one more byte
  // for HDF5's NULLTERM conversion to use.
  const size_t size = H5Tget_size(type.get());
  if (size == 0 || size > max_fixed) {
    problem = "has an implausible size (" + std::to_string(size) + " bytes)";
    return std::nullopt;
  }
  H5Tset_size(mem.get(), size + 1);
  H5Tset_strpad(mem.get(), H5T_STR_NULLTERM);
  std::string value(size + 1, '\0');
  if (H5Aread(attr, mem.get(), value.data()) < 0) {
    problem = "cannot be read";
    return std::nullopt;
  }
  value.resize(strnlen(value.data(), size));
  return value;
}

}  // namespace forge::hdf5
