package interop

// AMQPS with amqp091-go: a second Warren started with a [tls] section, certificates made here
// with crypto/x509 (no key is kept in the repository). Mirrors tests/interop/python/test_tls.py:
// a round trip trusting the CA, plain AMQP on the TLS port refused, and client certificates
// with verify_peer. Warren only: it writes the broker's config file.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// issued is a certificate with its key, and the signer for certificates it issues.
type issued struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

// issue makes a certificate for tmpl signed by parent (nil: self-signed, a CA).
func issue(t *testing.T, tmpl *x509.Certificate, parent *issued) *issued {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = sn
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(48 * time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &issued{cert: cert, der: der, key: key}
}

func newCA(t *testing.T, name string) *issued {
	return issue(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
}

func leaf(t *testing.T, name string, ca *issued, usage x509.ExtKeyUsage) *issued {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	return issue(t, tmpl, ca)
}

// writePEM writes the certificate (and, with a key file name, its PKCS#8 key) into dir.
func (c *issued) writePEM(t *testing.T, dir, certFile, keyFile string) {
	t.Helper()
	write := func(name, kind string, der []byte) {
		b := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(certFile, "CERTIFICATE", c.der)
	if keyFile != "" {
		der, err := x509.MarshalPKCS8PrivateKey(c.key)
		if err != nil {
			t.Fatal(err)
		}
		write(keyFile, "PRIVATE KEY", der)
	}
}

// tlsCerts are the CA, the server's certificate, a client certificate from the same CA, and
// one from a CA the broker does not trust, written to dir.
type tlsCerts struct {
	dir      string
	ca       *issued
	client   *issued
	stranger *issued
}

func makeCerts(t *testing.T) *tlsCerts {
	dir := t.TempDir()
	ca, other := newCA(t, "ca"), newCA(t, "other-ca")
	ca.writePEM(t, dir, "ca.pem", "")
	leaf(t, "server", ca, x509.ExtKeyUsageServerAuth).writePEM(t, dir, "server.pem", "server.key")
	return &tlsCerts{
		dir:      dir,
		ca:       ca,
		client:   leaf(t, "client", ca, x509.ExtKeyUsageClientAuth),
		stranger: leaf(t, "stranger", other, x509.ExtKeyUsageClientAuth),
	}
}

// clientConfig trusts the CA and presents cert (nil: no client certificate). The certificate
// is sent whatever CAs the server names (with Config.Certificates Go would silently send none
// when its issuer is not among them, which hides whether the broker refuses it).
func (c *tlsCerts) clientConfig(cert *issued) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.ca.cert)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost"}
	if cert != nil {
		tc := &tls.Certificate{Certificate: [][]byte{cert.der}, PrivateKey: cert.key}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return tc, nil
		}
	}
	return cfg
}

// startTLSBroker starts a Warren of this test's own with a [tls] section (extra appended) on a
// free port; it returns the broker and its AMQPS port, once that port accepts.
func startTLSBroker(t *testing.T, c *tlsCerts, extra string) (*warren, int) {
	t.Helper()
	bin := os.Getenv("WARREN_BIN")
	if bin == "" {
		t.Skip("writes the broker's config file: Warren only (WARREN_BIN)")
	}
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(c.dir, "warren.toml")
	toml := fmt.Sprintf("[tls]\nport = %d\ncert_file = '%s'\nkey_file = '%s'\n%s",
		port, filepath.Join(c.dir, "server.pem"), filepath.Join(c.dir, "server.key"), extra)
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := startWarren(bin, "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.stop)
	eventually(t, "the AMQPS port accepts", func() bool {
		nc, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	return w, port
}

func amqpsURL(port int) string {
	return fmt.Sprintf("amqps://guest:guest@127.0.0.1:%d/", port)
}

// tlsRoundTrip publishes a message over conn and consumes it back.
func tlsRoundTrip(t *testing.T, conn *amqp.Connection) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("channel over TLS: %v", err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatalf("queue.declare over TLS: %v", err)
	}
	body := strings.Repeat("over tls ", 20000) // several frames, several TLS records
	publish(t, ch, "", q.Name, body)
	ds, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("basic.consume over TLS: %v", err)
	}
	if got := string(recv(t, ds).Body); got != body {
		t.Fatalf("body over TLS: %d bytes back, want %d", len(got), len(body))
	}
}

// dialTLS is amqp.DialTLS with a bounded handshake.
func dialTLS(port int, cfg *tls.Config) (*amqp.Connection, error) {
	return amqp.DialConfig(amqpsURL(port), amqp.Config{
		TLSClientConfig: cfg,
		Dial:            amqp.DefaultDial(10 * time.Second),
	})
}

func TestTLSRoundTripAndPlainAMQPRefused(t *testing.T) {
	c := makeCerts(t)
	w, port := startTLSBroker(t, c, "")
	conn, err := amqp.DialTLS(amqpsURL(port), c.clientConfig(nil))
	if err != nil {
		t.Fatalf("amqp.DialTLS trusting the CA: %v", err)
	}
	defer conn.Close()
	tlsRoundTrip(t, conn)
	// The plain listener beside it is unchanged.
	plain, err := amqp.Dial(fmt.Sprintf("amqp://guest:guest@%s/", w.addr))
	if err != nil {
		t.Fatalf("plain AMQP beside TLS: %v", err)
	}
	tlsRoundTrip(t, plain)
	plain.Close()

	// Plain AMQP on the TLS port: the broker drops the socket (a failed TLS handshake), so the
	// client gets an error, not a hang.
	start := time.Now()
	bad, err := amqp.DialConfig(fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port),
		amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err == nil {
		bad.Close()
		t.Fatal("plain AMQP on the TLS port: connected, want an error")
	}
	if d := time.Since(start); d > 9*time.Second {
		t.Fatalf("plain AMQP on the TLS port: failed only after %v (timeout, not a clean drop): %v", d, err)
	}
	// A client that does not trust the server's CA refuses it.
	if bad, err := amqp.DialTLS(amqpsURL(port), &tls.Config{ServerName: "localhost"}); err == nil {
		bad.Close()
		t.Fatal("DialTLS without the CA: connected, want a certificate error")
	}
	eventually(t, "the broker logs the failed handshake", func() bool {
		return strings.Contains(w.stderr.String(), "TLS handshake failed")
	})
}

func TestTLSClientCertificatesVerifyPeer(t *testing.T) {
	c := makeCerts(t)
	_, port := startTLSBroker(t, c, fmt.Sprintf(
		"ca_file = '%s'\nverify = 'verify_peer'\nfail_if_no_peer_cert = true\n",
		filepath.Join(c.dir, "ca.pem")))
	conn, err := dialTLS(port, c.clientConfig(c.client))
	if err != nil {
		t.Fatalf("with a client certificate from the CA: %v", err)
	}
	defer conn.Close()
	tlsRoundTrip(t, conn)
	for name, cert := range map[string]*issued{"no client certificate": nil, "a certificate from another CA": c.stranger} {
		done := make(chan error, 1)
		go func() {
			bad, err := dialTLS(port, c.clientConfig(cert))
			if err == nil {
				bad.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("%s: connected, want the broker to refuse", name)
			}
			t.Logf("%s: refused: %v", name, err)
		case <-time.After(15 * time.Second):
			t.Fatalf("%s: no answer within 15s", name)
		}
	}
}

func TestTLSVerifyPeerWithoutFailIfNoPeerCert(t *testing.T) {
	c := makeCerts(t)
	_, port := startTLSBroker(t, c, fmt.Sprintf(
		"ca_file = '%s'\nverify = 'verify_peer'\n", filepath.Join(c.dir, "ca.pem")))
	conn, err := dialTLS(port, c.clientConfig(nil))
	if err != nil {
		t.Fatalf("without a client certificate (fail_if_no_peer_cert = false): %v", err)
	}
	conn.Close()
	bad, err := dialTLS(port, c.clientConfig(c.stranger))
	if err == nil {
		bad.Close()
		t.Fatal("a certificate from another CA: connected, want the broker to refuse")
	}
	t.Logf("a certificate from another CA: refused: %v", err)
}
