package main

import (
	"fmt"
	"strconv"
	"strings"
)

// htmlBody is /html64k's page: n bytes of HTML shaped like a real one (a
// head with inline CSS, a navigation bar, a catalogue of product cards with
// varied names, prices, ratings and descriptions, a footer), so it
// compresses as pages do, several times but not to nothing (gzip -6: about
// 7.7 to 1): not one
// repeated byte or sentence. The words are drawn by a fixed pseudo-random
// sequence, so the page is the same in every run and every build. The last
// card that fits is followed by an HTML comment that pads the page to
// exactly n bytes before its closing tags.
func htmlBody(n int) body {
	b := []byte(htmlPage(n))
	return body{data: b, length: []string{strconv.Itoa(len(b))}}
}

var (
	adjectives = []string{"Compact", "Wireless", "Ergonomic", "Stainless", "Portable", "Heavy-duty", "Organic",
		"Vintage", "Modular", "Waterproof", "Foldable", "Solar", "Rechargeable", "Handmade", "Insulated",
		"Adjustable", "Lightweight", "Smart", "Ceramic", "Bamboo"}
	nouns = []string{"Kettle", "Headphones", "Desk Lamp", "Backpack", "Water Bottle", "Keyboard", "Chair",
		"Blender", "Tent", "Speaker", "Notebook", "Thermos", "Router", "Monitor Arm", "Frying Pan",
		"Sleeping Bag", "Coffee Grinder", "Bike Light", "Charger", "Plant Pot"}
	categories = []string{"kitchen", "audio", "office", "outdoor", "home", "garden", "travel", "computing"}
	colours    = []string{"black", "white", "slate grey", "forest green", "navy", "sand", "terracotta", "red"}
	phrases    = []string{"Built to last with a two-year warranty", "Ships in recycled packaging",
		"Designed in Lisbon and assembled in Porto", "Dishwasher safe on the top rack",
		"Includes a USB-C cable and a quick-start guide", "Rated best in class by our customers",
		"Free returns within thirty days", "Replacement parts available for ten years",
		"Tested to IP67 against dust and water", "Certified by an independent laboratory",
		"Ideal for small flats and shared offices", "Pairs with the companion app on iOS and Android",
		"Made from responsibly sourced materials", "Quiet operation under forty decibels"}
)

// rng is splitmix64: a fixed sequence, whatever the Go version.
type rng uint64

func (r *rng) next() uint64 {
	*r += 0x9e3779b97f4a7c15
	z := uint64(*r)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func (r *rng) pick(list []string) string { return list[r.next()%uint64(len(list))] }
func (r *rng) intn(n int) int            { return int(r.next() % uint64(n)) }

func htmlPage(n int) string {
	const head = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Catalogue - scafo-edge bench shop</title>
<link rel="stylesheet" href="/static/site.css">
<style>
body { font-family: system-ui, sans-serif; margin: 0; color: #1d2330; background: #fafafa; }
header nav a { margin-right: 1.2rem; color: #0b5cad; text-decoration: none; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(16rem, 1fr)); gap: 1rem; padding: 1rem; }
.card { background: #fff; border: 1px solid #e3e6ea; border-radius: 6px; padding: 0.8rem; }
.card h2 { font-size: 1.05rem; margin: 0 0 0.4rem; }
.price { font-weight: 600; } .old { text-decoration: line-through; color: #8a8f98; }
.rating { color: #b07d00; } .stock-low { color: #b3261e; }
</style>
</head>
<body>
<header>
<nav><a href="/">Home</a><a href="/catalogue">Catalogue</a><a href="/offers">Offers</a><a href="/account">Account</a><a href="/basket">Basket (0)</a></nav>
<h1>Catalogue</h1>
</header>
<main class="grid">
`
	const tail = "</main>\n<footer><p>&copy; scafo-edge bench shop. Prices include VAT.</p></footer>\n</body>\n</html>\n"
	var b strings.Builder
	b.WriteString(head)
	r := rng(48)
	for id := 1000; ; id++ {
		cat := r.pick(categories)
		name := r.pick(adjectives) + " " + r.pick(nouns)
		price := 5 + r.intn(49500)
		card := fmt.Sprintf(`<article class="card" id="p%d" data-category="%s">
  <a href="/product/%d"><img src="/img/%d-%s.%012x.webp" alt="%s" width="320" height="240" loading="lazy"></a>
  <h2><a href="/product/%d">%s</a></h2>
  <p class="sku">SKU %s-%06d</p>
  <p class="price">&euro;%d.%02d`, id, cat, id, id, cat, r.next()>>16, name, id, name, strings.ToUpper(cat[:3]), r.intn(1000000), price/100, price%100)
		if r.intn(3) == 0 {
			old := price + 100 + r.intn(5000)
			card += fmt.Sprintf(` <span class="old">&euro;%d.%02d</span>`, old/100, old%100)
		}
		card += fmt.Sprintf(`</p>
  <p class="rating" title="%d.%d out of 5">%s (%d reviews)</p>
  <p>%s, in %s. %s.</p>
`, 3+r.intn(2), r.intn(10), strings.Repeat("&#9733;", 3+r.intn(3)), r.intn(2000), r.pick(phrases), r.pick(colours), r.pick(phrases))
		if r.intn(4) == 0 {
			card += fmt.Sprintf("  <p class=\"stock-low\">Only %d left in stock</p>\n", 1+r.intn(9))
		}
		card += fmt.Sprintf("  <button type=\"button\" data-add=\"%d\">Add to basket</button>\n</article>\n", id)
		// Room for the card, the padding comment's "<!---->\n" and the tail.
		if b.Len()+len(card)+8+len(tail) > n {
			break
		}
		b.WriteString(card)
	}
	if pad := n - b.Len() - len(tail); pad >= 8 {
		b.WriteString("<!--" + strings.Repeat(" ", pad-8) + "-->\n")
	} else {
		b.WriteString(strings.Repeat("\n", pad))
	}
	b.WriteString(tail)
	return b.String()
}
