package test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// browser is a headless Chromium driven over the Chrome DevTools Protocol:
// enough of it to load a page, read its rendered DOM with JavaScript and
// take a screenshot.
type browser struct {
	cmd  *exec.Cmd
	ws   *websocket.Conn
	mu   sync.Mutex
	next int
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

// startBrowser starts headless Chromium with a blank page; it is stopped
// when the test ends.
func startBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "--remote-allow-origins=*", "--user-data-dir="+t.TempDir(),
		"--window-size=1400,1500", "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", chromium, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	var browserWS string
	select {
	case browserWS = <-found:
	case <-time.After(30 * time.Second):
		t.Fatal("chromium did not print its DevTools address within 30s")
	}
	// The page's own endpoint: /json/list on the same host and port.
	host := strings.TrimPrefix(browserWS, "ws://")
	host = host[:strings.IndexByte(host, '/')]
	var targets []struct {
		Type string `json:"type"`
		WS   string `json:"webSocketDebuggerUrl"`
	}
	resp, err := http.Get("http://" + host + "/json/list")
	if err != nil {
		t.Fatalf("listing chromium's pages: %v", err)
	}
	err = json.NewDecoder(resp.Body).Decode(&targets)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	pageWS := ""
	for _, tg := range targets {
		if tg.Type == "page" {
			pageWS = tg.WS
		}
	}
	if pageWS == "" {
		t.Fatalf("chromium has no page: %+v", targets)
	}
	ws, err := websocket.Dial(pageWS, "", "http://127.0.0.1/")
	if err != nil {
		t.Fatalf("connecting to the page: %v", err)
	}
	ws.MaxPayloadBytes = 64 << 20
	t.Cleanup(func() { ws.Close() })
	return &browser{cmd: cmd, ws: ws}
}

// call sends one DevTools command and returns its result, skipping the
// events that arrive meanwhile.
func (b *browser) call(method string, params any) (json.RawMessage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	id := b.next
	if err := websocket.JSON.Send(b.ws, map[string]any{"id": id, "method": method, "params": params}); err != nil {
		return nil, err
	}
	_ = b.ws.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		var msg struct {
			ID     int             `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := websocket.JSON.Receive(b.ws, &msg); err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		if msg.ID != id {
			continue
		}
		if msg.Error != nil {
			return nil, fmt.Errorf("%s: %s", method, msg.Error.Message)
		}
		return msg.Result, nil
	}
}

func (b *browser) navigate(url string) error {
	_, err := b.call("Page.navigate", map[string]any{"url": url})
	return err
}

// eval runs a JavaScript expression in the page and decodes its value
// (the expression should return a JSON-able value) into out.
func (b *browser) eval(expr string, out any) error {
	res, err := b.call("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	if err != nil {
		return err
	}
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		Exception *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	if r.Exception != nil {
		return fmt.Errorf("evaluating %q: %s", expr, r.Exception.Text)
	}
	return json.Unmarshal(r.Result.Value, out)
}

// screenshot writes the page as a PNG file.
func (b *browser) screenshot(path string) error {
	res, err := b.call("Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true})
	if err != nil {
		return err
	}
	var r struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return err
	}
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		return err
	}
	return os.WriteFile(path, png, 0o644)
}
