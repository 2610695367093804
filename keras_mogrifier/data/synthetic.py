"""The embedded default corpus: news-like documents from a small grammar.

When neither a data directory nor a download of the Penn Treebank is
available, the library falls back to this corpus. It is entirely the
project's own: a hand-written probabilistic grammar (word lists below), name
pools made from its own syllables, and a seeded sampler — no third-party
text. It is built to look like the preprocessed Penn Treebank (lower case,
no punctuation, numbers as `N`, rare words as `<unk>`, one sentence per
line) and to be learnable:

- a vocabulary of about 1,000 words whose frequencies follow Zipf's law
  within each word class;
- local structure (determiner → adjective → noun, modal → base verb,
  `n't` after an auxiliary) that a bigram model captures;
- longer-range structure that it does not: subject–verb number agreement
  across prepositional phrases and relative clauses, verb classes that select
  animate or inanimate objects, pronoun case, reported speech (`said that`
  followed by a clause), company names followed by `corp`/`inc`;
- **documents**, the way news text comes: a blank line (an `<eos>` alone)
  separates them, and each document is about a topic (its nouns are much
  more frequent there) and a few entities of its own — people (a title and
  a surname) and companies (a name and its suffix) drawn from pools of
  hundreds — that it mentions again and again. Which names a document
  repeats cannot be known before it starts, so a model that adapts to the
  text as it reads (dynamic evaluation, a cache) predicts them far better
  than the trained model alone.

A small LSTM reaches a perplexity far below the unigram perplexity. The
generator uses only `random.Random.random` with a string seed, so the text is
identical on every platform and Python version; 120k tokens take well under
a second.
"""

import bisect
import functools
import math
import random

from keras_mogrifier._validation import non_negative_int
from keras_mogrifier._validation import positive_int
from keras_mogrifier.data.corpus import Corpus
from keras_mogrifier.data.vocabulary import UNK_TOKEN

# === Word lists (most frequent first within each class) ===

# Nouns for people: (singular, plural).
_PEOPLE = [
    ("analyst", "analysts"),
    ("official", "officials"),
    ("investor", "investors"),
    ("executive", "executives"),
    ("trader", "traders"),
    ("spokesman", "spokesmen"),
    ("chairman", "chairmen"),
    ("president", "presidents"),
    ("banker", "bankers"),
    ("lawyer", "lawyers"),
    ("manager", "managers"),
    ("economist", "economists"),
    ("director", "directors"),
    ("worker", "workers"),
    ("customer", "customers"),
    ("broker", "brokers"),
    ("dealer", "dealers"),
    ("shareholder", "shareholders"),
    ("partner", "partners"),
    ("buyer", "buyers"),
    ("seller", "sellers"),
    ("consultant", "consultants"),
    ("employee", "employees"),
    ("engineer", "engineers"),
    ("regulator", "regulators"),
    ("lawmaker", "lawmakers"),
    ("researcher", "researchers"),
    ("reporter", "reporters"),
    ("owner", "owners"),
    ("farmer", "farmers"),
    ("teacher", "teachers"),
    ("student", "students"),
    ("doctor", "doctors"),
    ("voter", "voters"),
    ("critic", "critics"),
    ("judge", "judges"),
]

# Nouns for things and institutions: (singular, plural).
_THINGS = [
    ("company", "companies"),
    ("market", "markets"),
    ("price", "prices"),
    ("share", "shares"),
    ("stock", "stocks"),
    ("bank", "banks"),
    ("rate", "rates"),
    ("bond", "bonds"),
    ("fund", "funds"),
    ("plan", "plans"),
    ("deal", "deals"),
    ("profit", "profits"),
    ("sale", "sales"),
    ("contract", "contracts"),
    ("report", "reports"),
    ("product", "products"),
    ("loss", "losses"),
    ("order", "orders"),
    ("unit", "units"),
    ("program", "programs"),
    ("budget", "budgets"),
    ("index", "indexes"),
    ("offer", "offers"),
    ("bid", "bids"),
    ("debt", "debts"),
    ("loan", "loans"),
    ("asset", "assets"),
    ("tax", "taxes"),
    ("law", "laws"),
    ("rule", "rules"),
    ("system", "systems"),
    ("computer", "computers"),
    ("car", "cars"),
    ("plant", "plants"),
    ("factory", "factories"),
    ("network", "networks"),
    ("building", "buildings"),
    ("agreement", "agreements"),
    ("proposal", "proposals"),
    ("project", "projects"),
    ("study", "studies"),
    ("issue", "issues"),
    ("business", "businesses"),
    ("firm", "firms"),
    ("group", "groups"),
    ("industry", "industries"),
    ("office", "offices"),
    ("store", "stores"),
    ("drug", "drugs"),
    ("chip", "chips"),
    ("machine", "machines"),
    ("truck", "trucks"),
    ("house", "houses"),
    ("policy", "policies"),
    ("account", "accounts"),
    ("estimate", "estimates"),
]

_PERSON_NAMES = [
    "brandt",
    "okafor",
    "lindqvist",
    "tanaka",
    "rivera",
    "castell",
    "petrov",
    "marlow",
    "achebe",
    "novak",
    "delgado",
    "huang",
    "ferreira",
    "kowalski",
    "moreau",
    "haddad",
    "sorensen",
    "quigley",
]
_COMPANY_NAMES = [
    "arbex",
    "delmont",
    "kestrel",
    "novaline",
    "orchard",
    "pellway",
    "tremont",
    "zephyra",
    "halvard",
    "corvane",
    "brightwater",
    "ostrava",
    "lumen",
    "vantor",
    "greyfield",
    "solbrook",
]
_COMPANY_SUFFIX = ["corp", "inc", "co", "group"]
_TITLES = ["mr.", "ms.", "mrs.", "dr."]

_ADJ_PEOPLE = [
    "senior",
    "former",
    "chief",
    "other",
    "top",
    "young",
    "independent",
    "local",
    "foreign",
    "angry",
    "private",
    "veteran",
]
_ADJ_THINGS = [
    "new",
    "big",
    "major",
    "other",
    "large",
    "small",
    "strong",
    "weak",
    "higher",
    "lower",
    "annual",
    "quarterly",
    "recent",
    "current",
    "federal",
    "foreign",
    "financial",
    "national",
    "early",
    "late",
    "long-term",
    "short-term",
    "total",
    "net",
    "average",
    "modest",
    "sharp",
    "steady",
    "previous",
    "proposed",
    "similar",
    "troubled",
    "industrial",
    "domestic",
    "global",
    "public",
    "final",
    "special",
    "key",
    "joint",
]

# Verbs: (base, third person singular, past).
_VERBS_THING_OBJECT = [
    ("buy", "buys", "bought"),
    ("sell", "sells", "sold"),
    ("expect", "expects", "expected"),
    ("report", "reports", "reported"),
    ("offer", "offers", "offered"),
    ("own", "owns", "owned"),
    ("make", "makes", "made"),
    ("announce", "announces", "announced"),
    ("acquire", "acquires", "acquired"),
    ("approve", "approves", "approved"),
    ("raise", "raises", "raised"),
    ("cut", "cuts", "cut"),
    ("build", "builds", "built"),
    ("hold", "holds", "held"),
    ("reject", "rejects", "rejected"),
    ("increase", "increases", "increased"),
    ("reduce", "reduces", "reduced"),
    ("pay", "pays", "paid"),
    ("sign", "signs", "signed"),
    ("launch", "launches", "launched"),
    ("review", "reviews", "reviewed"),
    ("complete", "completes", "completed"),
    ("close", "closes", "closed"),
    ("win", "wins", "won"),
    ("lose", "loses", "lost"),
    ("need", "needs", "needed"),
    ("boost", "boosts", "boosted"),
    ("propose", "proposes", "proposed"),
]
_VERBS_PERSON_OBJECT = [
    ("hire", "hires", "hired"),
    ("meet", "meets", "met"),
    ("tell", "tells", "told"),
    ("ask", "asks", "asked"),
    ("help", "helps", "helped"),
    ("warn", "warns", "warned"),
    ("name", "names", "named"),
    ("sue", "sues", "sued"),
    ("join", "joins", "joined"),
    ("replace", "replaces", "replaced"),
    ("elect", "elects", "elected"),
    ("thank", "thanks", "thanked"),
]
_VERBS_INTRANSITIVE = [
    ("rise", "rises", "rose"),
    ("fall", "falls", "fell"),
    ("climb", "climbs", "climbed"),
    ("drop", "drops", "dropped"),
    ("decline", "declines", "declined"),
    ("jump", "jumps", "jumped"),
    ("slip", "slips", "slipped"),
    ("grow", "grows", "grew"),
    ("surge", "surges", "surged"),
    ("ease", "eases", "eased"),
    ("rally", "rallies", "rallied"),
    ("stall", "stalls", "stalled"),
    ("recover", "recovers", "recovered"),
    ("tumble", "tumbles", "tumbled"),
]
_VERBS_PERSON_INTRANSITIVE = [
    ("resign", "resigns", "resigned"),
    ("retire", "retires", "retired"),
    ("agree", "agrees", "agreed"),
    ("complain", "complains", "complained"),
    ("wait", "waits", "waited"),
    ("object", "objects", "objected"),
]
_VERBS_SAY = [
    ("say", "says", "said"),
    ("believe", "believes", "believed"),
    ("think", "thinks", "thought"),
    ("argue", "argues", "argued"),
    ("note", "notes", "noted"),
    ("expect", "expects", "expected"),
    ("fear", "fears", "feared"),
    ("estimate", "estimates", "estimated"),
    ("insist", "insists", "insisted"),
]

_MODALS = ["will", "would", "could", "may", "might", "should", "can", "must"]
_PREPOSITIONS = [
    "of",
    "in",
    "for",
    "on",
    "at",
    "with",
    "from",
    "by",
    "about",
    "after",
    "under",
    "over",
    "into",
    "near",
]
_MOVE_ADVERBS = ["sharply", "slightly", "again", "steadily", "quickly", "modestly"]
_SENTENCE_ADVERBS = [
    "meanwhile",
    "however",
    "still",
    "now",
    "separately",
    "instead",
    "moreover",
    "currently",
]
_CONJUNCTIONS = ["and", "but", "while", "because", "although", "as", "so"]
_TIME_NOUNS = ["year", "week", "month", "quarter"]
_ORDINALS = ["first", "second", "third", "fourth"]
_WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday"]
_NUMBER_UNITS = ["percent", "million", "billion", "points", "cents"]

# Topics of documents: the things (singular, plural) and the people a
# document about the topic talks about far more often than others do.
_TOPICS = [
    {
        "things": [("car", "cars"), ("truck", "trucks"), ("engine", "engines"),
                   ("model", "models"), ("vehicle", "vehicles"), ("recall", "recalls"),
                   ("dealership", "dealerships"), ("tire", "tires")],
        "people": [("dealer", "dealers"), ("driver", "drivers"), ("mechanic", "mechanics")],
    },
    {
        "things": [("loan", "loans"), ("deposit", "deposits"), ("mortgage", "mortgages"),
                   ("branch", "branches"), ("account", "accounts"), ("rate", "rates"),
                   ("lender", "lenders"), ("reserve", "reserves")],
        "people": [("banker", "bankers"), ("borrower", "borrowers"), ("saver", "savers")],
    },
    {
        "things": [("computer", "computers"), ("chip", "chips"), ("software", "software"),
                   ("device", "devices"), ("server", "servers"), ("network", "networks"),
                   ("screen", "screens"), ("printer", "printers")],
        "people": [("engineer", "engineers"), ("programmer", "programmers"), ("user", "users")],
    },
    {
        "things": [("drug", "drugs"), ("trial", "trials"), ("patent", "patents"),
                   ("vaccine", "vaccines"), ("treatment", "treatments"), ("dose", "doses"),
                   ("clinic", "clinics"), ("hospital", "hospitals")],
        "people": [("doctor", "doctors"), ("patient", "patients"), ("researcher", "researchers")],
    },
    {
        "things": [("well", "wells"), ("pipeline", "pipelines"), ("barrel", "barrels"),
                   ("refinery", "refineries"), ("rig", "rigs"), ("tanker", "tankers"),
                   ("field", "fields"), ("reactor", "reactors")],
        "people": [("driller", "drillers"), ("geologist", "geologists"), ("supplier", "suppliers")],
    },
    {
        "things": [("store", "stores"), ("mall", "malls"), ("brand", "brands"),
                   ("chain", "chains"), ("catalog", "catalogs"), ("discount", "discounts"),
                   ("outlet", "outlets"), ("item", "items")],
        "people": [("shopper", "shoppers"), ("clerk", "clerks"), ("retailer", "retailers")],
    },
    {
        "things": [("newspaper", "newspapers"), ("station", "stations"), ("show", "shows"),
                   ("magazine", "magazines"), ("channel", "channels"), ("ad", "ads"),
                   ("studio", "studios"), ("film", "films")],
        "people": [("advertiser", "advertisers"), ("viewer", "viewers"), ("producer", "producers")],
    },
    {
        "things": [("airline", "airlines"), ("flight", "flights"), ("jet", "jets"),
                   ("route", "routes"), ("airport", "airports"), ("fare", "fares"),
                   ("ticket", "tickets"), ("carrier", "carriers")],
        "people": [("passenger", "passengers"), ("pilot", "pilots"), ("traveler", "travelers")],
    },
    {
        "things": [("court", "courts"), ("ruling", "rulings"), ("suit", "suits"),
                   ("case", "cases"), ("appeal", "appeals"), ("verdict", "verdicts"),
                   ("claim", "claims"), ("settlement", "settlements")],
        "people": [("judge", "judges"), ("lawyer", "lawyers"), ("plaintiff", "plaintiffs")],
    },
    {
        "things": [("crop", "crops"), ("harvest", "harvests"), ("farm", "farms"),
                   ("tractor", "tractors"), ("grain", "grains"), ("herd", "herds"),
                   ("acre", "acres"), ("subsidy", "subsidies")],
        "people": [("farmer", "farmers"), ("grower", "growers"), ("rancher", "ranchers")],
    },
    {
        "things": [("home", "homes"), ("apartment", "apartments"), ("tower", "towers"),
                   ("permit", "permits"), ("lot", "lots"), ("rent", "rents"),
                   ("lease", "leases"), ("mall", "malls")],
        "people": [("builder", "builders"), ("tenant", "tenants"), ("landlord", "landlords")],
    },
    {
        "things": [("bond", "bonds"), ("stock", "stocks"), ("index", "indexes"),
                   ("future", "futures"), ("option", "options"), ("yield", "yields"),
                   ("trade", "trades"), ("portfolio", "portfolios")],
        "people": [("trader", "traders"), ("broker", "brokers"), ("investor", "investors")],
    },
]

# Name pools: the hand-written names above, then names made of the
# syllables below (a seeded draw, the same everywhere), so that the pools
# are large: a name is rare in the corpus as a whole and frequent inside the
# few documents about its bearer.
_NAME_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "l", "m",
                "n", "p", "pr", "r", "s", "st", "t", "tr", "v", "w", "z"]
_NAME_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ou"]
_NAME_CODAS = ["", "", "n", "r", "l", "s", "m", "nd", "rk", "ll", "st", "rt"]
_PERSON_ENDINGS = ["son", "er", "ey", "ski", "ez", "ov", "berg", "ton", "ell",
                   "ard", "ini", "man", "stein", "ford"]
_COMPANY_ENDINGS = ["ex", "ia", "tek", "ix", "ora", "line", "wood", "field",
                    "bridge", "tron", "dyne", "vale", "gate", "star"]
_NUM_PEOPLE = 300
_NUM_COMPANIES = 200


def _name_pool(seeded, ending_list, size, taken):
    rng = random.Random(f"keras_mogrifier.synthetic/names/{seeded}")
    pool = []
    while len(pool) < size:
        parts = [
            rng.choice(_NAME_ONSETS), rng.choice(_NAME_VOWELS),
            rng.choice(_NAME_CODAS), rng.choice(ending_list),
        ]
        name = "".join(parts)
        if name not in taken:
            taken.add(name)
            pool.append(name)
    return pool


_UNK_RATE = 0.08  # share of content words replaced by <unk>, as in PTB


class _Choice:
    """Zipf-weighted choice among items: weight of rank r is 1 / (r + 1)."""

    def __init__(self, items, exponent=1.0):
        self.items = list(items)
        cumulative = []
        total = 0.0
        for rank in range(len(self.items)):
            total += 1.0 / (rank + 1) ** exponent
            cumulative.append(total)
        self.cumulative = cumulative
        self.total = total

    def __call__(self, rng_random):
        index = bisect.bisect_right(self.cumulative, rng_random() * self.total)
        return self.items[min(index, len(self.items) - 1)]


def _grammar_words():
    words = set(_COMPANY_SUFFIX) | set(_TITLES) | set(_PERSON_NAMES) | set(_COMPANY_NAMES)
    for pairs in (_PEOPLE, _THINGS):
        words.update(w for pair in pairs for w in pair)
    for topic in _TOPICS:
        for pairs in topic.values():
            words.update(w for pair in pairs for w in pair)
    for verbs in (_VERBS_THING_OBJECT, _VERBS_PERSON_OBJECT, _VERBS_INTRANSITIVE,
                  _VERBS_PERSON_INTRANSITIVE, _VERBS_SAY):
        words.update(w for forms in verbs for w in forms)
    for words_list in (_ADJ_PEOPLE, _ADJ_THINGS, _MODALS, _PREPOSITIONS, _MOVE_ADVERBS,
                       _SENTENCE_ADVERBS, _CONJUNCTIONS, _TIME_NOUNS, _ORDINALS,
                       _WEEKDAYS, _NUMBER_UNITS):
        words.update(words_list)
    return words


_TAKEN = _grammar_words()
_PERSON_POOL = _PERSON_NAMES + _name_pool(
    "people", _PERSON_ENDINGS, _NUM_PEOPLE - len(_PERSON_NAMES), _TAKEN
)
_COMPANY_POOL = _COMPANY_NAMES + _name_pool(
    "companies", _COMPANY_ENDINGS, _NUM_COMPANIES - len(_COMPANY_NAMES), _TAKEN
)

_PICK = {
    "people": _Choice(_PEOPLE),
    "things": _Choice(_THINGS),
    # Any name is about as likely as any other before a document names it.
    "person_names": _Choice(_PERSON_POOL, 0.3),
    "company_names": _Choice(_COMPANY_POOL, 0.3),
    "company_suffix": _Choice(_COMPANY_SUFFIX),
    "titles": _Choice(_TITLES, 1.5),
    "adj_people": _Choice(_ADJ_PEOPLE),
    "adj_things": _Choice(_ADJ_THINGS),
    "v_thing": _Choice(_VERBS_THING_OBJECT),
    "v_person": _Choice(_VERBS_PERSON_OBJECT),
    "v_intrans": _Choice(_VERBS_INTRANSITIVE),
    "v_person_intrans": _Choice(_VERBS_PERSON_INTRANSITIVE),
    "v_say": _Choice(_VERBS_SAY, 1.5),
    "modals": _Choice(_MODALS),
    "preps": _Choice(_PREPOSITIONS),
    "move_adv": _Choice(_MOVE_ADVERBS),
    "sent_adv": _Choice(_SENTENCE_ADVERBS),
    "conj": _Choice(_CONJUNCTIONS),
    "time_nouns": _Choice(_TIME_NOUNS),
    "ordinals": _Choice(_ORDINALS),
    "weekdays": _Choice(_WEEKDAYS, 0.5),
    "units": _Choice(_NUMBER_UNITS),
    "det_sg": _Choice(["the", "a", "this", "each", "one", "that", "every"], 1.5),
    "det_pl": _Choice(
        ["the", "some", "many", "these", "two", "several", "those", "three", "all"],
        1.5,
    ),
}

_SG, _PL = 0, 1


# Documents: their length in sentences (at least _DOC_MIN, then
# geometric with mean _DOC_MEAN more), how often a name slot names one of the
# document's own entities (else any name of the pool, once), how often a
# noun is one of the topic's, and how often names are used at all.
_DOC_MIN, _DOC_MEAN = 6, 20
_OWN_ENTITY = 0.9
_TOPIC_THING, _TOPIC_PERSON = 0.6, 0.35
_PERSON_NAME_RATE, _COMPANY_NAME_RATE = 0.4, 0.35
_PICK["topics"] = _Choice(range(len(_TOPICS)), 0.0)
_TOPIC_PICK = [
    {"things": _Choice(t["things"]), "people": _Choice(t["people"])} for t in _TOPICS
]


class _Document:
    """What one document is about: a topic and its own people and companies."""

    def __init__(self, sampler):
        r = sampler.r
        self.topic = _TOPIC_PICK[sampler.pick("topics")]
        self.sentences_left = _DOC_MIN + int(-_DOC_MEAN * math.log(1.0 - r()))
        people, companies = [], []
        for _ in range(1 + int(r() * 2)):  # 1-2 people
            people.append((sampler.pick("titles"), sampler.pick("person_names")))
        for _ in range(1 + int(r() * 2)):  # 1-2 companies
            suffix = sampler.pick("company_suffix") if r() < 0.7 else None
            companies.append((sampler.pick("company_names"), suffix))
        # The first named is the main one: Zipf over the document's entities.
        self.people = _Choice(people)
        self.companies = _Choice(companies)


class _Sampler:
    """Samples documents of sentences; every method appends words to `out`."""

    def __init__(self, rng):
        self.r = rng.random
        self.document = None

    def pick(self, name):
        return _PICK[name](self.r)

    def content(self, word):
        return UNK_TOKEN if self.r() < _UNK_RATE else word

    def next_line(self):
        """The next line: a sentence, or `""` between two documents."""
        if self.document is not None and self.document.sentences_left == 0:
            self.document = None
            return []
        if self.document is None:
            self.document = _Document(self)
        self.document.sentences_left -= 1
        return self.sentence()

    def thing(self, number):
        if self.r() < _TOPIC_THING:
            return self.document.topic["things"](self.r)[number]
        return self.pick("things")[number]

    def person_noun(self, number):
        if self.r() < _TOPIC_PERSON:
            return self.document.topic["people"](self.r)[number]
        return self.pick("people")[number]

    def person_name(self, out):
        if self.r() < _OWN_ENTITY:
            title, name = self.document.people(self.r)
            out.append(title)
            out.append(name)
        else:  # someone mentioned once
            out.append(self.pick("titles"))
            out.append(self.content(self.pick("person_names")))

    def company_name(self, out):
        if self.r() < _OWN_ENTITY:
            name, suffix = self.document.companies(self.r)
            out.append(name)
            if suffix is not None and self.r() < 0.8:
                out.append(suffix)
        else:
            out.append(self.content(self.pick("company_names")))
            if self.r() < 0.6:
                out.append(self.pick("company_suffix"))

    def sentence(self):
        out = []
        r = self.r
        if r() < 0.1:
            out.append(self.pick("sent_adv"))
        self.clause(out, depth=0)
        if r() < 0.3:
            out.append(self.pick("conj"))
            self.clause(out, depth=1)
        if r() < 0.3:
            self.time_expression(out)
        return out

    def clause(self, out, depth):
        number = _SG if self.r() < 0.6 else _PL
        animate = self.r() < 0.5
        self.noun_phrase(out, number, animate, depth, subject=True)
        self.verb_phrase(out, number, animate, depth)

    def noun_phrase(self, out, number, animate, depth, subject):
        r = self.r()
        if animate:
            if r < 0.12:
                if number == _SG:
                    out.append(
                        ("he", "she")[self.r() < 0.4]
                        if subject
                        else ("him", "her")[self.r() < 0.4]
                    )
                else:
                    out.append(
                        ("they", "we")[self.r() < 0.2]
                        if subject
                        else ("them", "us")[self.r() < 0.2]
                    )
                return
            if r < 0.12 + _PERSON_NAME_RATE and number == _SG:
                self.person_name(out)
                return
            out.append(self.pick("det_sg" if number == _SG else "det_pl"))
            if self.r() < 0.3:
                out.append(self.pick("adj_people"))
            out.append(self.content(self.person_noun(number)))
            if depth < 1 and self.r() < 0.12:
                out.append("who")
                self.verb_phrase(out, number, True, depth + 1)
        else:
            if r < _COMPANY_NAME_RATE and number == _SG:
                self.company_name(out)
                return
            if r < 0.25 and number == _PL:
                out.append("N")
            else:
                out.append(self.pick("det_sg" if number == _SG else "det_pl"))
                if self.r() < 0.4:
                    out.append(self.content(self.pick("adj_things")))
                    if self.r() < 0.15:
                        out.append(self.content(self.pick("adj_things")))
            out.append(self.content(self.thing(number)))
            if depth < 2 and self.r() < 0.18:
                out.append(self.pick("preps"))
                self.noun_phrase(
                    out,
                    _SG if self.r() < 0.6 else _PL,
                    self.r() < 0.3,
                    depth + 1,
                    subject=False,
                )
            elif depth < 1 and self.r() < 0.08:
                out.append("which")
                self.verb_phrase(out, number, False, depth + 1)

    def verb(self, out, number, forms):
        """Appends the verb in a tense agreeing with `number`."""
        r = self.r()
        if r < 0.15:
            out.append(self.pick("modals"))
            if self.r() < 0.1:
                out.append("not")
            out.append(forms[0])
        elif r < 0.55:
            if self.r() < 0.08:
                out.append("did")
                out.append("n't")
                out.append(forms[0])
            else:
                out.append(forms[2])
        elif self.r() < 0.08:
            out.append("does" if number == _SG else "do")
            out.append("n't")
            out.append(forms[0])
        else:
            out.append(forms[1] if number == _SG else forms[0])

    def verb_phrase(self, out, number, animate, depth):
        r = self.r()
        if animate:
            if r < 0.3 and depth < 2:
                self.verb(out, number, self.pick("v_say"))
                if self.r() < 0.5:
                    out.append("that")
                self.clause(out, depth + 1)
            elif r < 0.72:
                self.verb(out, number, self.pick("v_thing"))
                self.object_phrase(out, depth, animate=False)
            elif r < 0.9:
                self.verb(out, number, self.pick("v_person"))
                self.object_phrase(out, depth, animate=True)
            else:
                self.verb(out, number, self.pick("v_person_intrans"))
        else:
            if r < 0.4:
                self.verb(out, number, self.pick("v_thing"))
                self.object_phrase(out, depth, animate=False)
            else:
                self.verb(out, number, self.pick("v_intrans"))
                s = self.r()
                if s < 0.35:
                    out.append("N")
                    out.append(self.pick("units"))
                elif s < 0.55:
                    out.append(self.pick("move_adv"))
                elif s < 0.65:
                    out.append("to")
                    out.append("N")
                    out.append(self.pick("units"))

    def object_phrase(self, out, depth, animate):
        number = _SG if self.r() < 0.55 else _PL
        self.noun_phrase(out, number, animate, depth + 1, subject=False)

    def time_expression(self, out):
        r = self.r()
        if r < 0.35:
            out.append(("last", "this", "next")[int(self.r() * 2.2)])
            out.append(self.pick("time_nouns"))
        elif r < 0.6:
            out += ["in", "the", self.pick("ordinals"), "quarter"]
        elif r < 0.85:
            out.append("yesterday")
        else:
            out.append("on")
            out.append(self.pick("weekdays"))


@functools.lru_cache(maxsize=16)
def _lines(num_tokens, seed, split):
    sampler = _Sampler(random.Random(f"keras_mogrifier.synthetic/{seed}/{split}"))
    lines = []
    count = 0
    while count < num_tokens:
        words = sampler.next_line()
        lines.append(" ".join(words))
        count += len(words) + 1  # + <eos>
    return tuple(lines)


def synthetic_lines(num_tokens, seed=0, split="train"):
    """Sentences of the embedded grammar, one string per sentence.

    Sentences are drawn until they hold at least `num_tokens` word tokens,
    counting one `<eos>` per sentence. Each `(seed, split)` pair has its own
    random stream, so the sentences of a split do not depend on the sizes of
    the other splits, and a longer request extends a shorter one.

    Args:
        num_tokens: int. Number of tokens to draw (at least).
        seed: int. Seed of the sampler. Defaults to 0.
        split: str. Name of the split; part of the seed. Defaults to
            `"train"`.

    Returns:
        A list of str (words separated by single spaces, no `<eos>`).

    Example:

    >>> lines = synthetic_lines(100, seed=0)
    >>> lines == synthetic_lines(100, seed=0)
    True
    """
    positive_int("num_tokens", num_tokens)
    non_negative_int("seed", seed)
    if not isinstance(split, str) or not split:
        raise ValueError(
            f"Expected `split` to be a non-empty string. Received: split={split!r}"
        )
    return list(_lines(int(num_tokens), int(seed), split))


def synthetic_corpus(
    level="word",
    train_tokens=100_000,
    valid_tokens=10_000,
    test_tokens=10_000,
    seed=0,
):
    """The embedded synthetic corpus, tokenised like a PTB corpus.

    Sentences from the package's own probabilistic grammar (see this
    module's docstring), split into train/valid/test streams drawn
    independently, with the vocabulary built from the training split (it
    contains `<unk>`, so rare words of valid/test that training lacks map to
    it). Deterministic: the same arguments give the same ids everywhere.

    Args:
        level: str. `"word"` or `"char"` (as in `load_corpus`; the sizes
            below still count words). Defaults to `"word"`.
        train_tokens: int. Word tokens (with `<eos>`) of the training split.
            Defaults to 100000.
        valid_tokens: int. Of the validation split. Defaults to 10000.
        test_tokens: int. Of the test split. Defaults to 10000.
        seed: int. Seed of the sampler. Defaults to 0.

    Returns:
        A `Corpus` with `source="synthetic"`.

    Example:

    >>> corpus = synthetic_corpus(train_tokens=2000, valid_tokens=300,
    ...                           test_tokens=300)
    >>> corpus.source, len(corpus.train) >= 2000
    ('synthetic', True)
    """
    sizes = {
        "train": positive_int("train_tokens", train_tokens),
        "valid": positive_int("valid_tokens", valid_tokens),
        "test": positive_int("test_tokens", test_tokens),
    }
    non_negative_int("seed", seed)
    lines = {
        split: synthetic_lines(size, seed=seed, split=split)
        for split, size in sizes.items()
    }
    return Corpus.from_lines(lines, level=level, source="synthetic")
