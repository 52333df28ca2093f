# Sourced by the trainer tests that train the tiny BERT fixture through
# `refinery train` on the test devices (dp_staged, pp_staged, tp_staged, guarded).
#
# cls_jsonl FILE: 21 sequences of 3 to 10 words (seed 5), label 1 for every
# third (one of good/great/fun among filler words) else 0 (bad/awful/dull):
# uneven lengths, and with batch 8 x accum 2 a short last micro-batch.
cls_jsonl() {
    python3 - "$1" <<'PY'
import random, sys
random.seed(5)
pos, neg = ["good", "great", "fun"], ["bad", "awful", "dull"]
filler = "the a movie film plot actor story scene is was very".split()
with open(sys.argv[1], "w") as f:
    for i in range(21):
        y = 1 if i % 3 == 0 else 0
        words = random.sample(filler, random.randint(2, 9)) + [random.choice(pos if y else neg)]
        random.shuffle(words)
        f.write('{"id":"d%d","text":"%s","label":%d}\n' % (i, " ".join(words), y))
PY
}
