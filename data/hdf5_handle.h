// RAII for HDF5 identifiers, shared by token datasets (data/) and checkpoints (recipes/), and the
// switch that keeps HDF5 from printing its own error stack (users see Forge's one-line errors).
#pragma once

#include <hdf5.h>

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

}  // namespace forge::hdf5
