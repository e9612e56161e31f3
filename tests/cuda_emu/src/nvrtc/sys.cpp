// Files, directories and the host compiler's process, for the compile step.
#include "nvrtc_internal.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace cuemu_nvrtc {

std::string dirname_of(const std::string& p) {
  size_t s = p.rfind('/');
  if (s == std::string::npos) return ".";
  if (s == 0) return "/";
  return p.substr(0, s);
}

bool read_file(const std::string& path, std::string& out) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  out.clear();
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return true;
}

bool write_file(const std::string& path, const std::string& data) {
  FILE* f = fopen(path.c_str(), "wb");
  if (!f) return false;
  bool ok = fwrite(data.data(), 1, data.size(), f) == data.size();
  ok = fclose(f) == 0 && ok;
  return ok;
}

bool mkdirs(const std::string& path) {
  if (path.empty()) return true;
  struct stat st;
  if (stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  if (!mkdirs(dirname_of(path))) return false;
  return mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
}

void rmtree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      std::string p = path + "/" + e->d_name;
      struct stat st;
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) rmtree(p);
      else unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

// A relative path that stays inside the temp dir ("a/b.cuh" kept; absolute
// or ".." components reduced to the base name).
std::string safe_rel(const std::string& name, const char* fallback) {
  if (name.empty()) return fallback;
  if (name[0] == '/' || name.find("..") != std::string::npos) {
    size_t s = name.rfind('/');
    std::string b = s == std::string::npos ? name : name.substr(s + 1);
    return b.empty() || b == ".." ? fallback : b;
  }
  return name;
}

// Runs argv in `cwd`, stdout+stderr into `output`. Returns the exit status
// (-1 if it could not run).
int run_cmd(const std::vector<std::string>& argv, const std::string& cwd, std::string& output) {
  std::string logpath = cwd + "/.cmd-output";
  std::vector<char*> av;
  for (auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    output = std::string("fork failed: ") + strerror(errno);
    return -1;
  }
  if (pid == 0) {
    if (chdir(cwd.c_str()) != 0) _exit(127);
    int fd = open(logpath.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) _exit(127);
    dup2(fd, 1);
    dup2(fd, 2);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0) dup2(nul, 0);
    execvp(av[0], av.data());
    const char m[] = "cuemu nvrtc: cannot run the host compiler\n";
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      output = "waitpid failed";
      return -1;
    }
  }
  read_file(logpath, output);
  unlink(logpath.c_str());
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// <lib>/.. of this library: <root>/lib/libnvrtc.so -> <root>.
std::string lib_dir() {
  Dl_info info;
  if (dladdr((void*)&lib_dir, &info) && info.dli_fname) {
    char real[PATH_MAX];
    if (realpath(info.dli_fname, real)) return dirname_of(real);
    return dirname_of(info.dli_fname);
  }
  return ".";
}

std::string cache_dir() {
  if (const char* d = getenv("CUEMU_CACHE_DIR"); d && *d) return d;
  if (const char* d = getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/cuemu";
  if (const char* d = getenv("HOME"); d && *d) return std::string(d) + "/.cache/cuemu";
  return "/tmp/cuemu-cache";
}

}  // namespace cuemu_nvrtc
