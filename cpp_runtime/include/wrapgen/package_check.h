// Is a package directory what wrapgen.aot_compile wrote? Checked before model.so is dlopen'ed
// or weights.bin is read: a truncated library mapped by dlopen dies with SIGBUS, and a flipped
// byte in either file runs wrong code or wrong weights without a sound.
//
// SHA256SUMS (package format 3) lists every other file with its size and SHA-256 in the format
// of coreutils' sha256sum, and seals itself on its last line:
//
//   # wrapgen package format 3
//   # size 5822  metadata.json               one size line per file, sorted by name
//   ...
//   9f86d081...0f00a08  metadata.json       one SHA-256 line per file, sorted by name
//   ...
//   # sha256 of the lines above: 5e884898...42d1542
//
// Plain line parsing: the runner never reads metadata.json, so it needs no JSON. Sizes are
// checked before any file is hashed. Mirrors wrapgen/package_check.py; the messages are the
// same word for word.
#pragma once
#ifndef WRAPGEN_PACKAGE_CHECK_H_
#define WRAPGEN_PACKAGE_CHECK_H_

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "wrapgen/sha256.h"

namespace wrapgen {

constexpr int64_t kPackageFormat = 3;  // wrapgen/packaging.py PACKAGE_FORMAT
constexpr const char* kManifest = "SHA256SUMS";

class PackageError : public std::runtime_error {
 public:
  explicit PackageError(const std::string& message) : std::runtime_error(message) {}
};

// file name -> (size in bytes, SHA-256 as 64 lowercase hex digits)
using PackageManifest = std::map<std::string, std::pair<int64_t, std::string>>;

namespace package_detail {

constexpr const char* kHeaderPrefix = "# wrapgen package format ";
constexpr const char* kSizePrefix = "# size ";
constexpr const char* kSealPrefix = "# sha256 of the lines above: ";

[[noreturn]] inline void damaged(const std::string& package, const std::string& file, const std::string& problem) {
  throw PackageError("damaged wrapgen package " + package + ": " + file + " " + problem);
}

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

inline bool is_sha256(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

inline bool is_digits(const std::string& s, size_t max_length) {
  return !s.empty() && s.size() <= max_length && s.find_first_not_of("0123456789") == std::string::npos;
}

inline bool names_a_file(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name != kManifest && name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

inline std::string short_hash(const std::string& hex) { return hex.substr(0, 16) + "..."; }

// The whole file; false (errno set) when it cannot be read.
inline bool read_file(const std::string& path, std::string* out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char chunk[1 << 16];
  size_t n = 0;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) out->append(chunk, n);
  const bool ok = std::ferror(f) == 0;
  const int err = errno;
  std::fclose(f);
  errno = err;
  return ok;
}

}  // namespace package_detail

// The files SHA256SUMS lists, once its seal, its format and every line check out; throws
// PackageError naming the problem.
inline PackageManifest read_manifest(const std::string& package) {
  using namespace package_detail;
  const std::string path = package + "/" + kManifest;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      struct stat meta {};
      if (::stat((package + "/metadata.json").c_str(), &meta) == 0) {
        throw PackageError(
            "wrapgen package " + package + " has no " + kManifest + ": it was written by an older wrapgen (package format 1 or 2) " +
            "or the file was lost; export it again with wrapgen.aot_compile");
      }
      throw PackageError(package + " is not a wrapgen package (no " + kManifest + ")");
    }
    damaged(package, kManifest, std::string("cannot be read (") + std::strerror(err) + ")");
  }
  if (!S_ISREG(st.st_mode)) damaged(package, kManifest, "is not a regular file");
  std::string blob;
  if (!read_file(path, &blob)) {
    const int err = errno;
    damaged(package, kManifest, std::string("cannot be read (") + std::strerror(err) + ")");
  }

  size_t start = 0;  // of the last line
  if (blob.size() >= 2) {
    const size_t newline = blob.rfind('\n', blob.size() - 2);
    if (newline != std::string::npos) start = newline + 1;
  }
  const std::string seal = blob.empty() || blob.back() != '\n' ? "" : blob.substr(start, blob.size() - 1 - start);
  if (!starts_with(seal, kSealPrefix) || !is_sha256(seal.substr(std::strlen(kSealPrefix)))) {
    damaged(package, kManifest, std::string("has no seal: its last line is not \"") + kSealPrefix + "<64 hex digits>\" (truncated or edited)");
  }
  const std::string body = blob.substr(0, start);
  if (sha256_hex(body) != seal.substr(std::strlen(kSealPrefix))) {
    damaged(package, kManifest, "was changed after wrapgen wrote it (its content does not match the SHA-256 on its last line)");
  }
  std::vector<std::string> lines;
  for (size_t pos = 0; pos < body.size();) {
    const size_t newline = body.find('\n', pos);
    lines.push_back(body.substr(pos, newline - pos));
    pos = newline + 1;
  }
  const std::string format = lines.empty() || !starts_with(lines[0], kHeaderPrefix) ? "" : lines[0].substr(std::strlen(kHeaderPrefix));
  if (!is_digits(format, 9)) damaged(package, kManifest, "does not start with the line \"# wrapgen package format <N>\"");
  if (std::stoll(format) != kPackageFormat) {
    throw PackageError(
        "cannot load the wrapgen package " + package + ": package format " + std::to_string(std::stoll(format)) +
        ", this wrapgen reads format " + std::to_string(kPackageFormat));
  }

  std::map<std::string, int64_t> sizes;
  std::map<std::string, std::string> hashes;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const std::string number = std::to_string(i + 1);
    const bool size_line = starts_with(line, kSizePrefix);
    std::string value, name;
    bool well_formed = false;
    if (size_line) {
      const size_t skip = std::strlen(kSizePrefix), gap = line.find("  ", skip);
      if (gap != std::string::npos) {
        value = line.substr(skip, gap - skip);
        name = line.substr(gap + 2);
        well_formed = is_digits(value, 18);
      }
    } else if (line.size() >= 66 && line.compare(64, 2, "  ") == 0) {
      value = line.substr(0, 64);
      name = line.substr(66);
      well_formed = is_sha256(value);
    }
    if (!well_formed) {
      damaged(package, kManifest, "has a malformed line " + number +
                                      " (expected \"<64 hex digits>  <file name>\" or \"# size <bytes>  <file name>\")");
    }
    if (!names_a_file(name)) damaged(package, kManifest, "has line " + number + ", which does not name a file of the package");
    const bool seen = size_line ? !sizes.emplace(name, std::stoll(value)).second : !hashes.emplace(name, value).second;
    if (seen) damaged(package, kManifest, std::string("has a second ") + (size_line ? "size" : "SHA-256") + " line for " + name + " (line " + number + ")");
  }
  std::set<std::string> names;
  for (const auto& entry : sizes) names.insert(entry.first);
  for (const auto& entry : hashes) names.insert(entry.first);
  for (const std::string& name : names) {
    if (sizes.count(name) == 0) damaged(package, kManifest, "lists " + name + " without its size");
    if (hashes.count(name) == 0) damaged(package, kManifest, "lists " + name + " without its SHA-256");
  }
  for (const char* needed : {"metadata.json", "model.so", "weights.bin"}) {
    if (sizes.count(needed) == 0) damaged(package, kManifest, std::string("does not list ") + needed);
  }
  PackageManifest manifest;
  for (const auto& entry : sizes) manifest[entry.first] = {entry.second, hashes[entry.first]};
  return manifest;
}

// The files of the package at `package` once each is intact (sizes first: cheap, and a
// truncated file is caught before anything reads it; then the SHA-256s). Throws PackageError
// naming the file and what is wrong with it.
inline PackageManifest verify_package(const std::string& package) {
  using namespace package_detail;
  const PackageManifest manifest = read_manifest(package);
  for (const auto& entry : manifest) {
    const std::string& name = entry.first;
    struct stat st {};
    if (::stat((package + "/" + name).c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT) damaged(package, name, "is missing");
      damaged(package, name, std::string("cannot be read (") + std::strerror(err) + ")");
    }
    if (!S_ISREG(st.st_mode)) damaged(package, name, "is not a regular file");
    const int64_t actual = static_cast<int64_t>(st.st_size), recorded = entry.second.first;
    if (actual != recorded) {
      damaged(package, name, "has " + std::to_string(actual) + " bytes, but " + kManifest + " records " + std::to_string(recorded) +
                                 (actual < recorded ? " (truncated)" : " (it grew)"));
    }
  }
  for (const auto& entry : manifest) {
    std::string actual;
    if (!sha256_file(package + "/" + entry.first, &actual)) damaged(package, entry.first, "cannot be read to the end");
    if (actual != entry.second.second) {
      damaged(package, entry.first, std::string("does not match its SHA-256 in ") + kManifest + " (recorded " +
                                        short_hash(entry.second.second) + ", found " + short_hash(actual) + ")");
    }
  }
  return manifest;
}

}  // namespace wrapgen

#endif  // WRAPGEN_PACKAGE_CHECK_H_
