package interop

// Cluster mode (WARREN_CLUSTER=1, with WARREN_BIN): the suite runs through node 2 of a 3-node
// cluster instead of one broker. Every node runs with `queue_master_locator = "min-masters"`, and
// node 2 carries "ballast" (WARREN_CLUSTER_BALLAST, default 1000, non-durable non-exclusive queues
// warren.ballast.N declared through it with x-queue-master-locator: client-local), so min-masters
// never picks node 2: every non-exclusive queue a test declares without a locator of its own
// lives on node 1 or 3 and is served through node 2 by forwarding. Exclusive queues live on their
// connection's node (node 2). TestMain checks the placement before the tests run: a queue declared
// through node 2 without arguments must not be reported on warren2@localhost.
//
// brokerURL and mgmtURL are node 2's; sessionCluster gives a test the other nodes. A test that
// cannot run through a cluster node by its nature calls singleNode(t, why).

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// sessionCluster is cluster mode's cluster (the suite runs through sessionCluster.nodes[sessionNode],
// warren2@localhost); nil when the suite runs against one broker.
var sessionCluster *testCluster

// sessionNode is the index of the node the suite talks to in cluster mode.
const sessionNode = 1

const ballastPrefix = "warren.ballast."

// clusterModeOn: WARREN_CLUSTER set (not "0").
func clusterModeOn() bool {
	v := os.Getenv("WARREN_CLUSTER")
	return v != "" && v != "0"
}

// singleNode skips t in cluster mode: t cannot run through a node of a cluster by its nature
// (never a way to hide a divergence between a cluster node and a single broker).
func singleNode(t *testing.T, why string) {
	t.Helper()
	if sessionCluster != nil {
		t.Skip("single node only (WARREN_CLUSTER=1): " + why)
	}
}

// startSessionCluster starts cluster mode's three nodes, waits until each is ready (answers
// /api/overview, lists vhost '/') and lists all three running, adds node 2's ballast and checks
// that a queue declared through node 2 lives elsewhere. On an error the nodes are stopped and
// their logs are in the error.
func startSessionCluster() (*testCluster, error) {
	dir, err := os.MkdirTemp("", "warren-cluster-mode-go-")
	if err != nil {
		return nil, err
	}
	config := "queue_master_locator = \"min-masters\"\n" + os.Getenv("WARREN_SESSION_CONFIG")
	configPath := filepath.Join(dir, "warren.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	c := &testCluster{dir: dir, cookie: randomHex(16)}
	peers := []string{}
	for i := 1; i <= 3; i++ {
		ports := make([]int, 3)
		for j := range ports {
			if ports[j], err = freePort(); err != nil {
				return nil, err
			}
		}
		dataDir := filepath.Join(dir, fmt.Sprintf("n%d", i))
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return nil, err
		}
		n := &clusterNode{name: fmt.Sprintf("warren%d@localhost", i), amqpPort: ports[0], httpPort: ports[1],
			linkPort: ports[2], dataDir: dataDir, logPath: filepath.Join(dir, fmt.Sprintf("n%d.log", i)),
			configPath: configPath, cookie: c.cookie}
		c.nodes = append(c.nodes, n)
		peers = append(peers, n.linkAddr())
	}
	fail := func(err error) (*testCluster, error) {
		logs := ""
		for _, n := range c.nodes {
			logs += fmt.Sprintf("\n--- %s (AMQP %d, HTTP %d, link %d) log ---\n%s", n.name, n.amqpPort,
				n.httpPort, n.linkPort, tail(n.logText(), 6000))
		}
		c.stop()
		return nil, fmt.Errorf("%v%s", err, logs)
	}
	for _, n := range c.nodes {
		n.peers = peers
		if err := n.launch(); err != nil {
			return fail(err)
		}
	}
	deadline := time.Now().Add(clusterReadyTimeout)
	for _, n := range c.nodes {
		for !n.ready() {
			if !n.running() {
				return fail(fmt.Errorf("%s exited before it was ready", n.name))
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("%s did not answer /api/overview and list vhost '/' within %v", n.name, clusterReadyTimeout))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	names := c.names()
	for !allRunning(c.nodes, names) {
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("every node's /api/nodes did not list %v running within %v", names, clusterReadyTimeout))
		}
		time.Sleep(100 * time.Millisecond)
	}
	node := c.nodes[sessionNode]
	count := 1000
	if v := os.Getenv("WARREN_CLUSTER_BALLAST"); v != "" {
		if _, err := fmt.Sscan(v, &count); err != nil || count < 1 {
			return fail(fmt.Errorf("WARREN_CLUSTER_BALLAST=%q: want a positive number", v))
		}
	}
	if err := addBallast(node, count); err != nil {
		return fail(err)
	}
	if err := checkPlacement(node); err != nil {
		return fail(err)
	}
	return c, nil
}

// stop sends SIGTERM to every node at once (one by one, the last ones could wait for the gone
// ones), waits for each (SIGKILL after 10 s) and removes the directory.
func (c *testCluster) stop() {
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.cmd != nil {
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
		}
		n.mu.Unlock()
	}
	for _, n := range c.nodes {
		n.stop()
	}
	os.RemoveAll(c.dir)
}

// allRunning: every node's /api/nodes lists exactly names, each running.
func allRunning(nodes []*clusterNode, names []string) bool {
	for _, n := range nodes {
		st, out, err := n.api("GET", "/api/nodes", nil, 2*time.Second)
		if err != nil || st != 200 {
			return false
		}
		rows, _ := out.([]any)
		got := []string{}
		for _, r := range rows {
			if m, ok := r.(map[string]any); ok && m["running"] == true {
				got = append(got, fmt.Sprint(m["name"]))
			}
		}
		sort.Strings(got)
		if fmt.Sprint(got) != fmt.Sprint(names) {
			return false
		}
	}
	return true
}

// addBallast declares count queues warren.ballast.N through node with x-queue-master-locator:
// client-local (so they live on node), pipelined (no-wait) on one channel; a passive declare of
// the last one then waits for all of them.
func addBallast(node *clusterNode, count int) error {
	conn, err := amqp.DialConfig(node.url(), amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return fmt.Errorf("ballast: dial %s: %v", node.name, err)
	}
	defer conn.CloseDeadline(time.Now().Add(10 * time.Second))
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("ballast: channel on %s: %v", node.name, err)
	}
	args := amqp.Table{"x-queue-master-locator": "client-local"}
	for i := 0; i < count; i++ {
		if _, err := ch.QueueDeclare(fmt.Sprintf("%s%d", ballastPrefix, i), false, false, false, true, args); err != nil {
			return fmt.Errorf("ballast: queue.declare through %s: %v", node.name, err)
		}
	}
	last := fmt.Sprintf("%s%d", ballastPrefix, count-1)
	if _, err := ch.QueueDeclarePassive(last, false, false, false, false, nil); err != nil {
		return fmt.Errorf("ballast: passive queue.declare %s through %s: %v", last, node.name, err)
	}
	return nil
}

// checkPlacement declares a queue through node without arguments and checks, through node's
// API, that it lives on another node (min-masters and the ballast).
func checkPlacement(node *clusterNode) error {
	conn, err := amqp.DialConfig(node.url(), amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return fmt.Errorf("placement check: dial %s: %v", node.name, err)
	}
	defer conn.CloseDeadline(time.Now().Add(10 * time.Second))
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("placement check: channel on %s: %v", node.name, err)
	}
	probe := fmt.Sprintf("go-interop-cluster-mode-probe-%s", randomHex(6))
	if _, err := ch.QueueDeclare(probe, false, false, false, false, nil); err != nil {
		return fmt.Errorf("placement check: queue.declare %s through %s: %v", probe, node.name, err)
	}
	defer ch.QueueDelete(probe, false, false, false)
	st, out, err := node.api("GET", "/api/queues/%2f/"+probe, nil, 10*time.Second)
	if err != nil {
		return fmt.Errorf("placement check: GET /api/queues/%%2f/%s: %v", probe, err)
	}
	row, _ := out.(map[string]any)
	if st != 200 || row == nil || row["node"] == nil || row["node"] == node.name {
		return fmt.Errorf("cluster mode: a queue declared through %s without arguments should live on another node "+
			"(min-masters and the ballast); GET /api/queues/%%2f/%s: %d %v", node.name, probe, st, out)
	}
	return nil
}
