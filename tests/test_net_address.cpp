// The address a rank advertises (transport/net_address.h): NCCL's interface-name syntax, the order
// of the rules, host:port with IPv6 literals. The choice across hosts is shown on the
// network-namespace hosts (tests/python/test_multihost.py).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "harness.h"
#include "shoal/error.h"
#include "transport/net_address.h"

using namespace shoal;
using shoal_test::ScopedEnv;

namespace {

// Sets (or unsets) a variable for a scope; restores what was there.
TEST(NetAddress, IfnameSyntaxIsNccls) {
  struct Case {
    const char* spec;
    const char* name;
    bool admitted;
  } cases[] = {
      {"eth", "eth0", true},        {"eth", "eth10", true},         {"eth", "ens3", false},
      {"eth,ib", "ib0", true},      {"=eth0", "eth0", true},        {"=eth0", "eth01", false},
      {"=eth0,eth1", "eth1", true}, {"^docker,lo", "lo", false},    {"^docker,lo", "docker0", false},
      {"^docker,lo", "eth0", true}, {"^=eth0", "eth0", false},      {"^=eth0", "eth01", true},
      {"^lo", "loop7", false},      {"", "eth0", false},            {"^", "eth0", true},
  };
  for (const auto& c : cases) EXPECT_EQ(ifname_matches(c.spec, c.name), c.admitted) << c.spec << " vs " << c.name;
}

TEST(NetAddress, HostPortWithIpv6Literals) {
  EXPECT_EQ(join_host_port("10.0.0.1", 5), "10.0.0.1:5");
  EXPECT_EQ(join_host_port("fd00::2", 80), "[fd00::2]:80");
  EXPECT_EQ(join_host_port("node-3", 7), "node-3:7");
  std::string h, p;
  ASSERT_TRUE(split_host_port("[fd00::2]:80", &h, &p));
  EXPECT_EQ(h + " " + p, "fd00::2 80");
  ASSERT_TRUE(split_host_port("node-3:7", &h, &p));
  EXPECT_EQ(h + " " + p, "node-3 7");
  EXPECT_FALSE(split_host_port("[fd00::2]", &h, &p));
  EXPECT_FALSE(split_host_port("nohost", &h, &p));
  EXPECT_FALSE(split_host_port(":80", &h, &p));
  SockAddr a;
  ASSERT_EQ(resolve_host_port("[::1]:4242", &a), "");
  EXPECT_EQ(a.str(), "[::1]:4242");
  ASSERT_EQ(resolve_host_port("127.0.0.1:4242", &a), "");
  EXPECT_EQ(a.str(), "127.0.0.1:4242");
  EXPECT_NE(resolve_host_port("no-such-host.invalid:1", &a), "");
}

TEST(NetAddress, Loopback) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));  // Debian's /etc/hosts entry for the host's own name
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("fd00::1"));
  EXPECT_TRUE(is_loopback_address("::ffff:127.0.0.1"));  // IPv4 loopback, as a dual-stack socket names it
  EXPECT_FALSE(is_loopback_address("::ffff:10.0.0.1"));
}

TEST(NetAddress, RulesInOrder) {
  ScopedEnv a("SHOAL_HOST", nullptr), b("SHOAL_SOCKET_IFNAME", nullptr), c("SHOAL_SOCKET_FAMILY", nullptr);
  // The store's address, when every peer is on this host or it is not loopback.
  EXPECT_EQ(advertise_address("10.9.8.7", true), "10.9.8.7");
  EXPECT_EQ(advertise_address("127.0.0.1", false), "127.0.0.1");
  EXPECT_EQ(advertise_address("", false), "127.0.0.1");
  // Loopback with a peer elsewhere: an interface NCCL's default admits, or an error naming them.
  bool has_other = false;
  for (const auto& i : list_interfaces()) has_other = has_other || (i.name.rfind("lo", 0) != 0 && i.name.rfind("docker", 0) != 0);
  if (has_other) {
    EXPECT_FALSE(is_loopback_address(advertise_address("127.0.1.1", true)));
    EXPECT_FALSE(is_loopback_address(advertise_address("::ffff:127.0.0.1", true)));
  } else {
    try {
      advertise_address("127.0.1.1", true);
      ADD_FAILURE() << "no error without an interface other hosts can reach";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("SHOAL_SOCKET_IFNAME"), std::string::npos) << e.what();
    }
  }
  {
    ScopedEnv i("SHOAL_SOCKET_IFNAME", "=lo");
    EXPECT_EQ(advertise_address("10.9.8.7", true), "127.0.0.1");  // the interface wins over the store's address
    ScopedEnv h("SHOAL_HOST", "node-7");
    EXPECT_EQ(advertise_address("10.9.8.7", true), "node-7");  // SHOAL_HOST wins over both
  }
  {
    ScopedEnv i("SHOAL_SOCKET_IFNAME", "=no-such-if0");
    try {
      advertise_address("10.9.8.7", true);
      ADD_FAILURE() << "no error for an interface that does not exist";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("SHOAL_SOCKET_IFNAME==no-such-if0 admits no interface"), std::string::npos) << m;
      EXPECT_NE(m.find("lo 127.0.0.1"), std::string::npos) << m;  // names what there is
    }
  }
  {
    ScopedEnv f("SHOAL_SOCKET_FAMILY", "AF_INET7");
    EXPECT_THROW(advertise_address("", true), InvalidArgument);
  }
  {
    // The store's address only in the family asked for; loopback of that family otherwise.
    ScopedEnv f("SHOAL_SOCKET_FAMILY", "AF_INET6");
    EXPECT_EQ(advertise_address("fd00::7", true), "fd00::7");
    EXPECT_EQ(advertise_address("10.9.8.7", false), "::1");
  }
  {
    ScopedEnv h("SHOAL_HOST", "[fd00::9]");  // brackets as in host:port
    EXPECT_EQ(advertise_address("", true), "fd00::9");
  }
  bool lo6 = false;
  for (const auto& i : list_interfaces()) lo6 = lo6 || i.addr == "::1";
  if (lo6) {
    ScopedEnv i("SHOAL_SOCKET_IFNAME", "=lo"), f("SHOAL_SOCKET_FAMILY", "AF_INET6");
    EXPECT_EQ(advertise_address("", true), "::1");
  }
}

}  // namespace
