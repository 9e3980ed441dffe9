"""A small byte-level BPE tokenizer made on this machine, so made-up models need nothing from the Hugging Face hub.

It is trained on a short English text embedded below, so the same inputs always give the same tokenizer. Its
special tokens and ChatML chat template are the Qwen ones, which is enough for vLLM's /v1/chat/completions.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import SamoyedsError

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: Special tokens, in id order: they take ids 0, 1 and 2.
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]
#: Trained vocabulary size when the model allows it: large enough for whole common words, small enough for tiny models.
DEFAULT_VOCAB_SIZE = 1000
#: 256 byte tokens plus the special tokens: a byte-level tokenizer cannot be smaller.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Plain English about everyday things and about the models this project serves: BPE learns common words from it.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small cat sleeps in the warm sun by the window.
Once upon a time there was a little village near a river, and the people who lived there were farmers.
Every morning they walked to the fields, and every evening they came home to eat bread and drink milk.
The children played in the garden while their parents worked. They liked to run, to sing and to read books.
In the winter the snow covered the hills, and in the summer the trees were green and full of birds.
What is the weather like today? It is sunny and bright, but it may rain later in the afternoon.
Please tell me a short story about a friendly dragon who lives in a cave under the mountain.
The dragon was kind and gentle. He helped travellers find their way and kept the village safe at night.
Hello! How are you? I am fine, thank you. Can you help me with a question about my computer?
Of course. What would you like to know? I will do my best to give you a clear and useful answer.
Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees.
The sun is a star at the centre of our solar system. The earth moves around the sun once every year.
There are seven days in a week, twelve months in a year, and sixty minutes in an hour.
Numbers like one, two, three, four, five, six, seven, eight, nine and ten are used to count things.
A language model reads a sequence of tokens and predicts the next token, one step at a time.
A mixture of experts model has many expert networks in each layer, and a router chooses a few of them for
every token, so only a small part of the model is used for each token while the whole model stays large.
The router computes a score for every expert, keeps the top experts, and mixes their outputs with weights.
Sparse weights keep only some of the values in a matrix and set the others to zero, which saves memory and time.
Structured sparsity keeps a fixed number of values in every small group, so that hardware can skip the zeros.
The server receives a request, runs the model on a graphics processor, and sends back the generated text.
Large models are stored as many files of tensors, and each tensor has a name, a shape and a data type.
Good software is simple to use, easy to test, and clear about what it does when something goes wrong.
She opened the door, looked outside, and smiled because her friends had come to visit her at last.
He wrote a letter to his brother, who lived in a city far away, and told him about the new house.
We went to the market to buy apples, oranges, potatoes, carrots, fresh fish and a loaf of bread.
The teacher asked the students to write about their favourite place and to explain why they liked it.
Music, art and stories help people share their ideas and feelings with each other across the world.
If you want to learn something new, start with small steps, practise every day, and ask questions.
The train leaves the station at nine o'clock and arrives in the capital a little before noon.
Thank you for your message. I have read it carefully, and I think your plan is a very good one.
"""


def build_tokenizer(out_dir: Path, vocab_size: int) -> dict[str, int]:
    """Train the tokenizer to at most DEFAULT_VOCAB_SIZE tokens, fill its vocabulary to `vocab_size` (_fill_vocab),
    save it into `out_dir`; return the special token ids.

    The returned ids ("bos", "eos", "pad", "im_start", "im_end") go into the model's config.json, so the model and
    its tokenizer agree. Like Qwen, the tokenizer adds no BOS token; `<|endoftext|>` serves as bos, eos and pad.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB_SIZE:
        raise SamoyedsError(
            f"vocab_size {vocab_size} is too small for a byte-level tokenizer (at least {MIN_VOCAB_SIZE})"
        )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, DEFAULT_VOCAB_SIZE),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_fill_vocab(bpe, vocab_size),
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(str(out_dir))
    end_of_text = bpe.token_to_id(END_OF_TEXT)
    return {
        "bos": end_of_text,
        "eos": end_of_text,
        "pad": end_of_text,
        "im_start": bpe.token_to_id(IM_START),
        "im_end": bpe.token_to_id(IM_END),
    }


def _fill_vocab(bpe, vocab_size: int):
    """`bpe` with a token for every id below `vocab_size` the training left without one.

    A model of a real vocabulary (Qwen3's 151,936 ids) with made-up weights emits ids all over it. An id the
    tokenizer does not know decodes to nothing, and vLLM 0.26's incremental detokenizer (the `tokenizers`
    DecodeStream, started on the whole prompt) then decodes the prompt again at every step until an id it knows
    comes: in its output processor, 256 sequences of 1024-token prompts took ~15 ms a step (256 steps, a 2-core CPU;
    `benchmarks/detokenize.py`), about a fast model's whole decode step on an H200 at that context, and 3 ms with
    128-token prompts. With a token for every id: 0.4 ms.

    Each filler is a word of its own (" zqab"), and the model looks a whole word up before merging (ignore_merges),
    so text encodes back to the ids it was decoded from: `vllm bench serve` decodes runs of consecutive ids into its
    random prompts and encodes them again. No trained token is such a word, so the corpus encodes as before.
    """
    import json

    from tokenizers import Tokenizer

    spec = json.loads(bpe.to_str())
    vocab = spec["model"]["vocab"]
    taken = set(vocab.values())
    fillers = {f"Ġzq{_letters(i)}": i for i in range(vocab_size) if i not in taken}  # "Ġ": the byte-level space
    if clash := fillers.keys() & vocab.keys():
        raise SamoyedsError(f"filler tokens {sorted(clash)[:3]} are trained tokens too")
    vocab.update(fillers)
    spec["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(spec))


def _letters(number: int) -> str:
    """`number` in base 26, written in the letters a-z."""
    digits = ""
    while True:
        number, digit = divmod(number, 26)
        digits = chr(ord("a") + digit) + digits
        if not number:
            return digits
