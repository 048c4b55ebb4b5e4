// delayedbench: load generator for the x-delayed-message exchange (bench/delayed.sh).
//
//	lateness: one publisher at a fixed rate, each message with x-delay D ms and its intended due
//	          time (Unix ns) in the body; one consumer measures arrival - due.
//	pending:  N messages with a long x-delay (none come due), as fast as publisher confirms allow.
//
// Output: human-readable lines plus one "RESULT key=value ..." line for scripts.
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

var (
	mode     = flag.String("mode", "lateness", "lateness | pending")
	uri      = flag.String("uri", "amqp://guest:guest@127.0.0.1:5701/%2f", "broker")
	exchange = flag.String("exchange", "delayed-bench", "delayed exchange name (declared, deleted after)")
	rate     = flag.Int("rate", 1000, "lateness: messages per second")
	duration = flag.Duration("duration", 10*time.Second, "lateness: publishing time")
	delayMs  = flag.Int("delay", 1000, "x-delay in ms (pending mode default: 3600000)")
	count    = flag.Int("n", 10_000_000, "pending: messages to publish")
	maxTime  = flag.Duration("max-time", 4*time.Minute, "pending: stop publishing after this long")
	window   = flag.Int("window", 1000, "pending: unconfirmed messages outstanding")
	size     = flag.Int("size", 16, "body bytes (at least 8 in lateness mode)")
	prefetch = flag.Int("prefetch", 1000, "lateness: consumer prefetch (acks multiple every prefetch/10)")
	keep     = flag.Bool("keep", false, "pending: leave the exchange (and its messages) in place")
	mix      = flag.Int("mix", 1, "pending: of every MIX messages one is delayed, the others carry no x-delay and an unbound routing key (routed at once, dropped); -n counts the delayed ones")
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	switch *mode {
	case "lateness":
		lateness()
	case "pending":
		pending()
	default:
		log.Fatalf("unknown mode %q", *mode)
	}
}

func dial() *amqp.Connection {
	c, err := amqp.Dial(*uri)
	if err != nil {
		log.Fatalf("dial %s: %v", *uri, err)
	}
	return c
}

func must(err error, what string) {
	if err != nil {
		log.Fatalf("%s: %v", what, err)
	}
}

func declare(ch *amqp.Channel, queue string) {
	must(ch.ExchangeDeclare(*exchange, "x-delayed-message", false, false, false, false,
		amqp.Table{"x-delayed-type": "direct"}), "declare exchange")
	if queue != "" {
		_, err := ch.QueueDeclare(queue, false, false, false, false, nil)
		must(err, "declare queue")
		must(ch.QueueBind(queue, "k", *exchange, false, nil), "bind")
	}
}

func ms(ns int64) string { return fmt.Sprintf("%.2f", float64(ns)/1e6) }

func pct(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func lateness() {
	if *size < 8 {
		*size = 8
	}
	queue := *exchange + "-q"
	setupConn := dial()
	setup, err := setupConn.Channel()
	must(err, "channel")
	_, _ = setup.QueueDelete(queue, false, false, false)
	_ = setup.ExchangeDelete(*exchange, false, false)
	declare(setup, queue)

	// Consumer on its own connection.
	cconn := dial()
	cch, err := cconn.Channel()
	must(err, "channel")
	must(cch.Qos(*prefetch, 0, false), "qos")
	deliveries, err := cch.Consume(queue, "", false, false, false, false, nil)
	must(err, "consume")
	expected := *rate * int(duration.Seconds())
	lat := make([]int64, 0, expected+1024)
	// Worst lateness per second of arrival, to see spikes over time.
	perSec := map[int64]int64{}
	var received atomic.Int64
	var firstArr, lastArr int64
	ackEvery := *prefetch / 10
	if ackEvery < 1 {
		ackEvery = 1
	}
	var wg sync.WaitGroup
	wg.Add(1)
	done := make(chan struct{})
	var startNs int64
	go func() {
		defer wg.Done()
		n := 0
		for {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return
				}
				now := time.Now().UnixNano()
				if len(d.Body) >= 8 {
					due := int64(binary.BigEndian.Uint64(d.Body))
					l := now - due
					lat = append(lat, l)
					sec := (now - atomic.LoadInt64(&startNs)) / 1e9
					if l > perSec[sec] {
						perSec[sec] = l
					}
				}
				if firstArr == 0 {
					firstArr = now
				}
				lastArr = now
				n++
				if n%ackEvery == 0 {
					_ = d.Ack(true)
				}
				received.Add(1)
			case <-done:
				return
			}
		}
	}()

	pconn := dial()
	pch, err := pconn.Channel()
	must(err, "channel")
	body := make([]byte, *size)
	headers := amqp.Table{"x-delay": int32(*delayMs)}
	delay := time.Duration(*delayMs) * time.Millisecond
	ctx := context.Background()
	start := time.Now()
	atomic.StoreInt64(&startNs, start.UnixNano())
	sent := 0
	var behind time.Duration // worst publisher lag behind schedule
	for {
		el := time.Since(start)
		if sent >= expected {
			break
		}
		target := int(el.Seconds() * float64(*rate))
		if target >= expected {
			target = expected
		}
		if sent >= target {
			time.Sleep(200 * time.Microsecond)
			continue
		}
		for sent < target {
			now := time.Now()
			binary.BigEndian.PutUint64(body, uint64(now.Add(delay).UnixNano()))
			err := pch.PublishWithContext(ctx, *exchange, "k", false, false, amqp.Publishing{
				Headers: headers, DeliveryMode: amqp.Transient, Body: body,
			})
			must(err, "publish")
			sent++
		}
		if lag := time.Since(start) - time.Duration(float64(sent)/float64(*rate)*1e9); lag > behind {
			behind = lag
		}
	}
	pubEl := time.Since(start)
	// Wait for everything: the delay plus grace.
	deadline := time.Now().Add(delay + 15*time.Second)
	for received.Load() < int64(sent) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	rcv := received.Load()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	var recvRate float64
	if lastArr > firstArr {
		recvRate = float64(rcv) / (float64(lastArr-firstArr) / 1e9)
	}
	var minL, maxL int64
	if len(lat) > 0 {
		minL, maxL = lat[0], lat[len(lat)-1]
	}
	// Delivered before the due time by more than the broker's millisecond rounding.
	early := sort.Search(len(lat), func(i int) bool { return lat[i] >= -2e6 })
	earlyPct := 0.0
	if len(lat) > 0 {
		earlyPct = 100 * float64(early) / float64(len(lat))
	}
	fmt.Printf("lateness: rate %d/s for %s, x-delay %d ms, %d-byte bodies\n", *rate, *duration, *delayMs, *size)
	fmt.Printf("  sent %d in %.2fs (%.0f/s, worst publisher lag %s), received %d (%.0f/s)\n",
		sent, pubEl.Seconds(), float64(sent)/pubEl.Seconds(), behind.Round(time.Millisecond), rcv, recvRate)
	fmt.Printf("  lateness ms: min %s p50 %s p99 %s p999 %s max %s; %.1f%% delivered over 2 ms early\n",
		ms(minL), ms(pct(lat, 0.5)), ms(pct(lat, 0.99)), ms(pct(lat, 0.999)), ms(maxL), earlyPct)
	// Seconds whose worst lateness is over 10 ms.
	var secs []int64
	for s, l := range perSec {
		if l > 10e6 {
			secs = append(secs, s)
		}
	}
	sort.Slice(secs, func(i, j int) bool { return secs[i] < secs[j] })
	if len(secs) > 0 {
		fmt.Printf("  seconds (from start) with max lateness > 10 ms:")
		for i, s := range secs {
			if i == 20 {
				fmt.Printf(" ...")
				break
			}
			fmt.Printf(" %d:%sms", s, ms(perSec[s]))
		}
		fmt.Println()
	}
	fmt.Printf("RESULT mode=lateness rate=%d delay=%d sent=%d received=%d recv_rate=%.0f min_ms=%s p50_ms=%s p99_ms=%s p999_ms=%s max_ms=%s early_pct=%.1f lag_ms=%d\n",
		*rate, *delayMs, sent, rcv, recvRate, ms(minL), ms(pct(lat, 0.5)), ms(pct(lat, 0.99)), ms(pct(lat, 0.999)), ms(maxL), earlyPct, behind.Milliseconds())
	_, _ = setup.QueueDelete(queue, false, false, false)
	_ = setup.ExchangeDelete(*exchange, false, false)
	cconn.Close()
	pconn.Close()
	setupConn.Close()
	if rcv < int64(sent) {
		os.Exit(1)
	}
}

func pending() {
	d := *delayMs
	if !isSet("delay") {
		d = 3_600_000
	}
	conn := dial()
	setup, err := conn.Channel()
	must(err, "channel")
	_ = setup.ExchangeDelete(*exchange, false, false)
	declare(setup, "")
	// Bound queue so a due message would have somewhere to go (none comes due in the run).
	_, err = setup.QueueDeclare(*exchange+"-q", false, false, false, false, nil)
	must(err, "declare queue")
	must(setup.QueueBind(*exchange+"-q", "k", *exchange, false, nil), "bind")
	ch, err := conn.Channel()
	must(err, "channel")
	must(ch.Confirm(false), "confirm.select")
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, *window+16))
	body := make([]byte, *size)
	headers := amqp.Table{"x-delay": int32(d)}
	ctx := context.Background()
	start := time.Now()
	sent, total, acked, nacked, outstanding := 0, 0, 0, 0, 0
	lastReport := start
	stopped := false
	for sent < *count {
		if time.Since(start) > *maxTime {
			stopped = true
			break
		}
		for outstanding >= *window {
			c := <-confirms
			outstanding--
			if c.Ack {
				acked++
			} else {
				nacked++
			}
		}
		binary.BigEndian.PutUint64(body, uint64(sent))
		if *mix > 1 && total%*mix != 0 {
			must(ch.PublishWithContext(ctx, *exchange, "unbound", false, false, amqp.Publishing{
				DeliveryMode: amqp.Transient, Body: body,
			}), "publish")
			total++
			outstanding++
			continue
		}
		must(ch.PublishWithContext(ctx, *exchange, "k", false, false, amqp.Publishing{
			Headers: headers, DeliveryMode: amqp.Transient, Body: body,
		}), "publish")
		sent++
		total++
		outstanding++
		if total%100000 == 0 && time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			el := time.Since(start).Seconds()
			fmt.Printf("  %6.0fs %d published (%.0f/s)\n", el, total, float64(total)/el)
		}
	}
	for outstanding > 0 {
		c := <-confirms
		outstanding--
		if c.Ack {
			acked++
		} else {
			nacked++
		}
	}
	el := time.Since(start)
	fmt.Printf("pending: %d delayed messages (%d-byte bodies, x-delay %d ms) of %d published and confirmed in %.1fs: %.0f/s; nacked %d%s\n",
		sent, *size, d, total, el.Seconds(), float64(total)/el.Seconds(), nacked,
		map[bool]string{true: " (stopped at -max-time)", false: ""}[stopped])
	fmt.Printf("RESULT mode=pending delayed=%d total=%d acked=%d nacked=%d secs=%.1f rate=%.0f stopped=%v\n",
		sent, total, acked, nacked, el.Seconds(), float64(total)/el.Seconds(), stopped)
	if !*keep {
		_ = setup.ExchangeDelete(*exchange, false, false)
		_, _ = setup.QueueDelete(*exchange+"-q", false, false, false)
	}
	conn.Close()
}

func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
