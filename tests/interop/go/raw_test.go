package interop

// A tiny hand-rolled AMQP 0-9-1 client, used only for the few things
// amqp091-go cannot express: an empty consumer tag (the library always
// generates its own), advertising authentication_failure_close (the library
// overwrites the capabilities table), bad protocol headers and
// channel-level protocol violations.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
)

type rawFrame struct {
	typ     byte
	channel uint16
	payload []byte
}

// method returns class and method id of a method frame.
func (f rawFrame) method() (uint16, uint16) {
	if f.typ != frameMethod || len(f.payload) < 4 {
		return 0, 0
	}
	return binary.BigEndian.Uint16(f.payload[0:2]), binary.BigEndian.Uint16(f.payload[2:4])
}

func (f rawFrame) String() string {
	c, m := f.method()
	return fmt.Sprintf("frame{type=%d ch=%d method=%d.%d len=%d}", f.typ, f.channel, c, m, len(f.payload))
}

type rawConn struct {
	t  *testing.T
	nc net.Conn
}

// argument encoder
type enc struct{ bytes.Buffer }

func (e *enc) u8(v byte)    { e.WriteByte(v) }
func (e *enc) u16(v uint16) { _ = binary.Write(&e.Buffer, binary.BigEndian, v) }
func (e *enc) u32(v uint32) { _ = binary.Write(&e.Buffer, binary.BigEndian, v) }
func (e *enc) u64(v uint64) { _ = binary.Write(&e.Buffer, binary.BigEndian, v) }
func (e *enc) shortstr(s string) {
	e.u8(byte(len(s)))
	e.WriteString(s)
}
func (e *enc) longstr(s string) {
	e.u32(uint32(len(s)))
	e.WriteString(s)
}

// table encodes a field table with string, bool and nested-table values.
func (e *enc) table(kv map[string]any) {
	var in enc
	for k, v := range kv {
		in.shortstr(k)
		switch v := v.(type) {
		case string:
			in.u8('S')
			in.longstr(v)
		case bool:
			in.u8('t')
			if v {
				in.u8(1)
			} else {
				in.u8(0)
			}
		case map[string]any:
			in.u8('F')
			in.table(v)
		default:
			panic(fmt.Sprintf("raw table: unsupported %T", v))
		}
	}
	e.u32(uint32(in.Len()))
	e.Write(in.Bytes())
}

// argument decoder
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || len(d.b) < n {
		d.err = io.ErrUnexpectedEOF
		return make([]byte, n)
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}
func (d *dec) u8() byte         { return d.take(1)[0] }
func (d *dec) u16() uint16      { return binary.BigEndian.Uint16(d.take(2)) }
func (d *dec) u32() uint32      { return binary.BigEndian.Uint32(d.take(4)) }
func (d *dec) shortstr() string { return string(d.take(int(d.u8()))) }
func (d *dec) longstr() string  { return string(d.take(int(d.u32()))) }
func (d *dec) skipTable()       { d.take(int(d.u32())) }
func newDec(f rawFrame) *dec    { return &dec{b: f.payload[4:]} }

func rawDial(t *testing.T) *rawConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", brokerAddr, 10*time.Second)
	if err != nil {
		t.Fatalf("raw dial %s: %v", brokerAddr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

func (c *rawConn) write(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("raw write: %v", err)
	}
}

func (c *rawConn) sendFrame(typ byte, channel uint16, payload []byte) {
	c.t.Helper()
	var b enc
	b.u8(typ)
	b.u16(channel)
	b.u32(uint32(len(payload)))
	b.Write(payload)
	b.u8(frameEnd)
	c.write(b.Bytes())
}

func (c *rawConn) sendMethod(channel, class, method uint16, args func(*enc)) {
	c.t.Helper()
	var p enc
	p.u16(class)
	p.u16(method)
	if args != nil {
		args(&p)
	}
	c.sendFrame(frameMethod, channel, p.Bytes())
}

// readFrame reads the next non-heartbeat frame.
func (c *rawConn) readFrame() (rawFrame, error) {
	for {
		var hdr [7]byte
		if _, err := io.ReadFull(c.nc, hdr[:]); err != nil {
			return rawFrame{}, err
		}
		size := binary.BigEndian.Uint32(hdr[3:7])
		if size > 1<<24 {
			return rawFrame{}, fmt.Errorf("absurd frame size %d", size)
		}
		buf := make([]byte, size+1)
		if _, err := io.ReadFull(c.nc, buf); err != nil {
			return rawFrame{}, err
		}
		if buf[size] != frameEnd {
			return rawFrame{}, fmt.Errorf("bad frame end 0x%02x", buf[size])
		}
		f := rawFrame{typ: hdr[0], channel: binary.BigEndian.Uint16(hdr[1:3]), payload: buf[:size]}
		if f.typ == frameHeartbeat {
			continue
		}
		return f, nil
	}
}

// expect reads a frame and checks it is the given method.
func (c *rawConn) expect(class, method uint16) rawFrame {
	c.t.Helper()
	f, err := c.readFrame()
	if err != nil {
		c.t.Fatalf("raw: waiting for %d.%d: %v", class, method, err)
	}
	if gc, gm := f.method(); gc != class || gm != method {
		if gc == 10 && gm == 50 {
			d := newDec(f)
			code := d.u16()
			text := d.shortstr()
			c.t.Fatalf("raw: waiting for %d.%d, got connection.close %d %q", class, method, code, text)
		}
		c.t.Fatalf("raw: waiting for %d.%d, got %v", class, method, f)
	}
	return f
}

// expectClose reads until a connection.close (10.50) or channel.close
// (20.40) arrives and returns (class.method of the close, code, text).
func (c *rawConn) expectClose() (uint16, uint16, string) {
	c.t.Helper()
	for {
		f, err := c.readFrame()
		if err != nil {
			c.t.Fatalf("raw: waiting for a close: %v", err)
		}
		cl, m := f.method()
		if (cl == 10 && m == 50) || (cl == 20 && m == 40) {
			d := newDec(f)
			code := d.u16()
			text := d.shortstr()
			return cl, code, text
		}
	}
}

// handshake performs the whole connection handshake (PLAIN, no heartbeats)
// with the given client capabilities, ending after connection.open-ok.
func (c *rawConn) handshake(caps map[string]any, user, pass, vhost string) {
	c.t.Helper()
	c.write([]byte("AMQP\x00\x00\x09\x01"))
	c.expect(10, 10) // connection.start
	c.sendMethod(0, 10, 11, func(e *enc) {
		e.table(map[string]any{"product": "warren-go-interop-raw", "capabilities": caps})
		e.shortstr("PLAIN")
		e.longstr("\x00" + user + "\x00" + pass)
		e.shortstr("en_US")
	})
	f := c.expect(10, 30) // connection.tune
	d := newDec(f)
	chMax, frameMax, hb := d.u16(), d.u32(), d.u16()
	_ = hb
	c.sendMethod(0, 10, 31, func(e *enc) {
		e.u16(chMax)
		e.u32(frameMax)
		e.u16(0) // no heartbeats
	})
	c.sendMethod(0, 10, 40, func(e *enc) {
		e.shortstr(vhost)
		e.shortstr("")
		e.u8(0)
	})
	c.expect(10, 41) // connection.open-ok
}

func (c *rawConn) openChannel(id uint16) {
	c.t.Helper()
	c.sendMethod(id, 20, 10, func(e *enc) { e.shortstr("") })
	c.expect(20, 11)
}

func rawGuest(t *testing.T) (string, string, string) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	pass, _ := u.User.Password()
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	} else if v, err := url.PathUnescape(vhost); err == nil {
		vhost = v
	}
	return u.User.Username(), pass, vhost
}

func TestRawBadProtocolHeader(t *testing.T) {
	c := rawDial(t)
	c.write([]byte("HTTP/1.1 GET /\r\n\r\n"))
	// RabbitMQ answers an unsupported header with its own protocol header
	// and closes the socket.
	buf := make([]byte, 8)
	if _, err := io.ReadFull(c.nc, buf); err != nil {
		t.Fatalf("reading protocol header reply: %v", err)
	}
	if string(buf) != "AMQP\x00\x00\x09\x01" {
		t.Fatalf("server replied %q, want AMQP 0-9-1 header", buf)
	}
	one := make([]byte, 1)
	if n, err := c.nc.Read(one); err == nil || n != 0 {
		t.Fatalf("socket still open after bad header (read %d, %v)", n, err)
	}
}

func TestRawAuthFailureCloseCapability(t *testing.T) {
	c := rawDial(t)
	user, _, _ := rawGuest(t)
	c.write([]byte("AMQP\x00\x00\x09\x01"))
	c.expect(10, 10)
	c.sendMethod(0, 10, 11, func(e *enc) {
		e.table(map[string]any{"capabilities": map[string]any{"authentication_failure_close": true}})
		e.shortstr("PLAIN")
		e.longstr("\x00" + user + "\x00wrong-password")
		e.shortstr("en_US")
	})
	// With authentication_failure_close the broker explains itself with a
	// connection.close instead of just dropping the socket.
	cl, code, text := c.expectClose()
	if cl != 10 || code != 403 {
		t.Fatalf("got close class %d code %d %q, want connection.close 403", cl, code, text)
	}
	if want := "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."; text != want {
		t.Fatalf("text %q, want %q", text, want)
	}
	c.sendMethod(0, 10, 51, nil)
}

func TestRawEmptyConsumerTagIsServerGenerated(t *testing.T) {
	c := rawDial(t)
	user, pass, vhost := rawGuest(t)
	c.handshake(map[string]any{"consumer_cancel_notify": true}, user, pass, vhost)
	c.openChannel(1)
	// server-named exclusive queue
	c.sendMethod(1, 50, 10, func(e *enc) {
		e.u16(0)
		e.shortstr("")
		e.u8(0x04) // exclusive
		e.table(nil)
	})
	f := c.expect(50, 11)
	q := newDec(f).shortstr()
	if !strings.HasPrefix(q, "amq.gen-") {
		t.Fatalf("server-named queue %q, want amq.gen- prefix", q)
	}
	tags := map[string]bool{}
	for i := 0; i < 2; i++ {
		c.sendMethod(1, 60, 20, func(e *enc) {
			e.u16(0)
			e.shortstr(q)
			e.shortstr("") // let the server pick the tag
			e.u8(0)
			e.table(nil)
		})
		f = c.expect(60, 21)
		tag := newDec(f).shortstr()
		if !strings.HasPrefix(tag, "amq.ctag-") {
			t.Fatalf("server-generated consumer tag %q, want amq.ctag- prefix", tag)
		}
		tags[tag] = true
	}
	if len(tags) != 2 {
		t.Fatalf("server generated the same consumer tag twice: %v", tags)
	}
	c.sendMethod(0, 10, 50, func(e *enc) { e.u16(200); e.shortstr("bye"); e.u16(0); e.u16(0) })
	c.expect(10, 51)
}

func TestRawSecondChannelOpenIsHardError(t *testing.T) {
	c := rawDial(t)
	user, pass, vhost := rawGuest(t)
	c.handshake(map[string]any{}, user, pass, vhost)
	c.openChannel(1)
	c.sendMethod(1, 20, 10, func(e *enc) { e.shortstr("") })
	cl, code, text := c.expectClose()
	if cl != 10 || code != 504 {
		t.Fatalf("got close class %d code %d %q, want connection.close 504", cl, code, text)
	}
	if want := "CHANNEL_ERROR - second 'channel.open' seen"; text != want {
		t.Fatalf("text %q, want %q", text, want)
	}
	c.sendMethod(0, 10, 51, nil)
}

func TestRawMethodOnUnopenedChannelIsHardError(t *testing.T) {
	c := rawDial(t)
	user, pass, vhost := rawGuest(t)
	c.handshake(map[string]any{}, user, pass, vhost)
	// queue.declare on channel 3, which was never opened
	c.sendMethod(3, 50, 10, func(e *enc) {
		e.u16(0)
		e.shortstr("")
		e.u8(0x04)
		e.table(nil)
	})
	cl, code, text := c.expectClose()
	if cl != 10 || code != 504 {
		t.Fatalf("got close class %d code %d %q, want connection.close 504", cl, code, text)
	}
	if want := "CHANNEL_ERROR - expected 'channel.open'"; text != want {
		t.Fatalf("text %q, want %q", text, want)
	}
	c.sendMethod(0, 10, 51, nil)
}
