"""The frame the benches' SVG plots share (not a timed test): a white page,
the two axes and their labels. Each plot adds its ticks, lines and legend."""


def frame(w, h, left, bottom, right, xlabel, ylabel, xlabel_at=None):
    """The SVG's opening elements for a w x h plot whose axes meet at
    (left, h - bottom) and whose x axis ends `right` pixels from the edge;
    the x axis's label is centred at xlabel_at (the page's middle unless
    given). The caller appends to the list and closes it with "</svg>"."""
    xlabel_at = w / 2 if xlabel_at is None else xlabel_at
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
            f'<rect width="{w}" height="{h}" fill="white"/>',
            f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
            f'<line x1="{left}" y1="20" x2="{left}" y2="{h - bottom}" stroke="black"/>',
            f'<text x="{xlabel_at}" y="{h - 10}" text-anchor="middle">{xlabel}</text>',
            f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">{ylabel}</text>']
