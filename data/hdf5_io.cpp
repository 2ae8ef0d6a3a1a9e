// The HDF5 helpers of data/hdf5_io.h: string attributes read without trusting their stored size,
// and every call checked so that a failure is one Error naming the file and the attribute.
#include "data/hdf5_io.h"

#include <cstring>

namespace forge::hdf5 {

std::optional<std::string> read_string_attr(hid_t attr, std::string& problem, size_t max_fixed) {
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

void Reporter::fail(const std::string& what) const { throw Error(code, name + ": " + what); }

Hid Reporter::check(hid_t id, herr_t (*close)(hid_t), const std::string& what) const {
  if (id < 0) fail(what);
  return Hid(id, close);
}

void Reporter::check(herr_t rc, const std::string& what) const {
  if (rc < 0) fail(what);
}

Hid file_access_plist() {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  // 1.8 object headers and superblock carry checksums, so corrupt metadata fails at open; every
  // HDF5 since 1.8 (and so every h5py) reads them.
  H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18);
  // Forge is the only writer of its files; file locks fail on some network file systems and would
  // only add a way to break.
  H5Pset_file_locking(fapl.get(), false, true);
  return fapl;
}

namespace {

Hid scalar_attr(const Reporter& file, hid_t obj, const std::string& name, hid_t type) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  return file.check(H5Acreate2(obj, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                    H5Aclose, "cannot create attribute '" + name + "'");
}

// "attribute 'step'", "attribute 'crc32' on dataset '/model/w'".
std::string attr_label(const std::string& name, const std::string& where) {
  return "attribute '" + name + "'" + (where.empty() ? "" : " on " + where);
}

Hid open_attr(const Reporter& file, hid_t obj, const std::string& name, const std::string& where) {
  if (H5Aexists(obj, name.c_str()) <= 0) file.fail("missing " + attr_label(name, where));
  return file.check(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose,
                    "cannot open " + attr_label(name, where));
}

}  // namespace

void write_attr_int(const Reporter& file, hid_t obj, const std::string& name, hid_t file_type,
                    int64_t value) {
  Hid attr = scalar_attr(file, obj, name, file_type);
  file.check(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value),
             "cannot write attribute '" + name + "'");
}

// Variable-length: h5py reads it back as a Python str, and the text lives in the global heap, so a
// long checkpoint config is not limited by the 64 KiB object-header attribute size.
void write_attr_str(const Reporter& file, hid_t obj, const std::string& name,
                    const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hid attr = scalar_attr(file, obj, name, type.get());
  const char* p = value.c_str();
  file.check(H5Awrite(attr.get(), type.get(), &p), "cannot write attribute '" + name + "'");
}

int64_t read_attr_int(const Reporter& file, hid_t obj, const std::string& name,
                      const std::string& where) {
  Hid attr = open_attr(file, obj, name, where);
  Hid type(H5Aget_type(attr.get()), H5Tclose);
  Hid space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.get()) != 1)
    file.fail(attr_label(name, where) + " is not an integer");
  int64_t value = 0;
  file.check(H5Aread(attr.get(), H5T_NATIVE_INT64, &value),
             "cannot read " + attr_label(name, where));
  return value;
}

std::string read_attr_str(const Reporter& file, hid_t obj, const std::string& name,
                          const std::string& where) {
  Hid attr = open_attr(file, obj, name, where);
  std::string problem;
  std::optional<std::string> value = read_string_attr(attr.get(), problem);
  if (!value) file.fail(attr_label(name, where) + " " + problem);
  return *value;
}

}  // namespace forge::hdf5
