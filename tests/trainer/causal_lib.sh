# Sourced by the trainer tests that train the tiny causal fixtures through
# `refinery train` (causal_dp, tp_causal, mesh, lora_device_run, pp_staged,
# lora_dp_staged); needs $root (the repository).
#
# causal_models NAME...: each tests/fixtures/causal/NAME (config and weights)
# copied to ./NAME with a vocab.txt of its 64 ids ([PAD] [UNK] [CLS] [SEP]
# [MASK] w5..w63), so JSONL text of w-words tokenizes into the vocabulary.
causal_models() {
    local m
    for m in "$@"; do
        mkdir "$m"
        cp "$root/tests/fixtures/causal/$m/config.json" "$root/tests/fixtures/causal/$m/model.safetensors" "$m/"
        python3 -c 'import sys; open(sys.argv[1], "w").write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + ["w%d" % i for i in range(5, 64)]) + "\n")' "$m/vocab.txt"
    done
}

# lm_jsonl FILE [sft]: 40 documents of 3 to 30 w-words (seed 5), each word's
# successor the next id (learnable); with sft, every fifth a
# prompt/completion pair (the prompt is not a target).
lm_jsonl() {
    python3 - "$1" "${2:-}" <<'PY'
import random, sys
random.seed(5)
sft = sys.argv[2] == "sft"
with open(sys.argv[1], "w") as f:
    for i in range(40):
        n = random.randint(3, 30)
        s = random.randint(5, 63)
        words = ["w%d" % (5 + (s - 5 + k) % 59) for k in range(n)]
        if sft and i % 5 == 4:
            f.write('{"prompt":"%s","completion":"%s"}\n' % (" ".join(words[:n // 2]), " ".join(words[n // 2:])))
        else:
            f.write('{"text":"%s"}\n' % " ".join(words))
PY
}
