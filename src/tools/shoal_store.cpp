// shoal-store: a standalone TcpStore server, for launching the ranks of a job by hand on several
// hosts (docs/launch.md). Runs until SIGINT/SIGTERM/SIGHUP.
//
//   shoal-store --port P [--host 0.0.0.0]
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace shoal::detail {
// Defined in src/store/tcp_store_server.cpp: a TcpStore server without a client; the handle stops it.
std::shared_ptr<void> start_store_server(const std::string& bind_host, uint16_t port, uint16_t* bound_port);
}  // namespace shoal::detail

namespace {

const char* kUsage =
    "usage: shoal-store --port P [--host ADDRESS]\n"
    "\n"
    "Serves a shoal TCP store until SIGINT/SIGTERM. Start the ranks with\n"
    "SHOAL_STORE=<this host>:P SHOAL_STORE_SERVER=0 (see docs/launch.md).\n"
    "\n"
    "options:\n"
    "  --port P        TCP port to listen on (0: any free port, printed at start)\n"
    "  --host ADDRESS  address to bind (default 0.0.0.0: every interface)\n"
    "  --help          this text\n";

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "shoal-store: %s\n\n%s", msg.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "0.0.0.0";
  long port = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::string val;
    auto take = [&](const std::string& name) -> bool {
      if (a == name) {
        if (i + 1 >= argc) return false;
        val = argv[++i];
        return true;
      }
      if (a.rfind(name + "=", 0) == 0) {
        val = a.substr(name.size() + 1);
        return true;
      }
      return false;
    };
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (take("--port")) {
      char* end = nullptr;
      errno = 0;
      port = std::strtol(val.c_str(), &end, 10);
      if (val.empty() || errno || *end || port < 0 || port > 65535) return usage_error("bad port '" + val + "'");
    } else if (take("--host")) {
      host = val;
    } else {
      return usage_error("unexpected argument '" + a + "'");
    }
  }
  if (port < 0) return usage_error("missing --port");

  // Block the stop signals before the server thread starts (it inherits the mask), then wait.
  sigset_t stop;
  sigemptyset(&stop);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, s);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::shared_ptr<void> server;
  uint16_t bound = 0;
  try {
    server = shoal::detail::start_store_server(host, static_cast<uint16_t>(port), &bound);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shoal-store: %s\n", e.what());
    return 1;
  }
  std::printf("shoal-store: listening on %s:%u\n", host.c_str(), bound);
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {}
  std::fprintf(stderr, "shoal-store: got SIG%s, stopping\n", sigabbrev_np(sig));
  server.reset();
  return 0;
}
