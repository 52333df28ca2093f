"""Checks of a run report as Chromium rendered it (tests/pipeline/report.test.sh).

usage: report_check.py dom DOM.html CHART_ID...
         the DOM Chromium dumped (--dump-dom): every named chart is an <svg
         class="chart"> holding drawn marks (bars of non-zero width, a curve
         with points, heat-map cells); no <script>, no element that loads
         anything (src, or an href that is not a fragment); the hostile
         strings of the test data are text, not markup.
       report_check.py png SHOT.png
         the screenshot is not blank: many non-white pixels, and the bar and
         curve colours of the report's stylesheet are there (the charts were
         painted, not just laid out).
Standard library only (html.parser, zlib)."""
import sys
import zlib
from html.parser import HTMLParser


class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts = {}  # id -> {"marks": n}
        self.current = None
        self.scripts = 0
        self.loaders = []
        self.text = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        for k in ("src", "srcset", "data", "poster"):
            if k in a:
                self.loaders.append((tag, k, a[k]))
        if tag in ("link", "a", "use", "image") and "href" in a and not a["href"].startswith("#"):
            self.loaders.append((tag, "href", a["href"]))
        if tag == "svg" and "chart" in a.get("class", "").split():
            self.current = a.get("data-chart")
            self.charts[self.current] = {"marks": 0}
        elif self.current:
            marks = self.charts[self.current]
            if tag == "rect" and a.get("class") in ("bar", "cell"):
                if float(a.get("width", "0")) > 0:
                    marks["marks"] += 1
            elif tag == "polyline" and len(a.get("points", "").split()) >= 2:
                marks["marks"] += 1
            elif tag == "circle":
                marks["marks"] += 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self.current = None

    def handle_data(self, data):
        self.text.append(data)


def check_dom(path, ids):
    d = Dom()
    d.feed(open(path, encoding="utf-8", errors="replace").read())
    fails = []
    for i in ids:
        if i not in d.charts:
            fails.append(f"chart {i} missing")
        elif d.charts[i]["marks"] == 0:
            fails.append(f"chart {i} draws nothing")
    if d.scripts:
        fails.append(f"{d.scripts} <script> elements")
    if d.loaders:
        fails.append(f"elements that load: {d.loaders[:5]}")
    text = "".join(d.text)
    for hostile in ("<script>alert('x')</script>", '"><img src=x onerror=alert(1)>'):
        if hostile not in text:
            fails.append(f"hostile string {hostile!r} not shown as text")
    if fails:
        sys.exit("DOM: " + "; ".join(fails))
    print(f"dom ok: {len(d.charts)} charts ({', '.join(sorted(d.charts))})")


def png_pixels(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h = int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big")
            depth, ctype = body[8], body[9]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and ctype in (2, 6), f"unsupported PNG depth {depth} type {ctype}"
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def check_png(path):
    w, h, bpp, rows = png_pixels(path)
    nonwhite = bar = curve = 0
    for line in rows:
        for x in range(0, len(line), bpp):
            r, g, b = line[x], line[x + 1], line[x + 2]
            if r < 240 or g < 240 or b < 240:
                nonwhite += 1
            if abs(r - 0x4A) < 12 and abs(g - 0x86) < 12 and abs(b - 0xC5) < 12:
                bar += 1
            if abs(r - 0xC0) < 25 and abs(g - 0x50) < 25 and abs(b - 0x4D) < 25:
                curve += 1
    share = nonwhite / (w * h)
    print(f"png {w}x{h}: {share:.1%} non-white, {bar} bar pixels, {curve} curve pixels")
    if share < 0.02 or bar < 500 or curve < 50:
        sys.exit("screenshot looks blank or without charts")


if __name__ == "__main__":
    if sys.argv[1] == "dom":
        check_dom(sys.argv[2], sys.argv[3:])
    else:
        check_png(sys.argv[2])
