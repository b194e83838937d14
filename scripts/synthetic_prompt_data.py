"""Data for scripts/synthetic_prompts.py: prompt templates per category, the lists that fill them, and passages.

A template's `{field}` is filled from FILLERS[field]; `{field2}`, `{field3}` ... draw further, distinct values of
the same list; `{passage}` draws from PASSAGES; `{a}`, `{b}`, `{c}` are random integers chosen by the generator.
Everything here is original writing for this project (nothing is taken from MT-Bench or HumanEval, which are
the evaluation sets).
"""
from __future__ import annotations

TEMPLATES: dict[str, list[str]] = {}
FILLERS: dict[str, list[str]] = {}

TEMPLATES["writing"] = [
    "Write a short story about {person} who finds {object} in {place}.",
    "Write a {form} about {topic}, in a {tone} tone.",
    "Draft an email to {audience} announcing {event}. Keep it under 150 words.",
    "Describe {place} through the eyes of {person}.",
    "Write the opening scene of a mystery set in {place}, where the first clue is {object}.",
    "Write a product description for {object} aimed at {audience}.",
    "Write the short speech that {person} gives to the town about {event}.",
    "Compose a letter from {person} to their younger self about {topic}.",
    "Write a dialogue between {person} and {person2} who cannot agree about {topic}.",
    "Write a bedtime story in which {object} comes to life one night in {place}.",
    "Write a {tone} review of an imaginary cafe in {place}.",
    "Write a {form} told from the point of view of {object}.",
]

TEMPLATES["roleplay"] = [
    "You are {role}. A visitor asks what an ordinary working day looks like for you. Answer in character.",
    "Act as {role}. I am {situation}. What would you tell me?",
    "Stay in character as {person} and tell me about the strangest thing that ever happened to you in {place}.",
    "Play the part of {role} interviewing me for a job on your team. Ask me your first three questions.",
    "You are {person} living in {era}. Describe your morning from the moment you wake up.",
    "Imagine you are {object} that has spent fifty years in {place}. Tell me what you have seen.",
    "Take the role of {role}. I am {situation}. Give me your honest opinion, in your own voice.",
    "Be my guide: you are a local in {place}. Welcome our small group and tell us where we are going first.",
    "I want you to act as {role} helping me with {skill}. Start by asking what I already know.",
    "Speak as {person} writing a notice to the whole village about {event}.",
    "Let's role-play. You are {role}, speaking to {audience}. Teach them about {concept} in your own style.",
    "Pretend you are {person} from {era} who has just arrived in our time. React to {object}.",
]

TEMPLATES["reasoning"] = [
    "{name}, {name2} and {name3} ran a race. {name} finished ahead of {name2}, and {name3} crossed the line "
    "after {name2}. Who came last? Explain how you know.",
    "{name} is older than {name2}, and {name3} is younger than {name2}. Can we say whether {name} is older than "
    "{name3}? Explain your reasoning.",
    "Consider this argument: \"{argument}\" Is the reasoning sound? Point out any flaw you find.",
    "I need to decide {decision}. Walk me through the considerations step by step, then recommend one option.",
    "Here is an observation: {observation}. List possible explanations, from most to least likely, and say how "
    "to test each one.",
    "A drawer holds {a} grey socks and {b} green socks. In complete darkness, how many socks must {name} take "
    "out to be sure of a matching pair? Explain.",
    "{name}, {name2} and {name3} each keep exactly one pet: a rabbit, a goldfish or a canary. {name} is "
    "allergic to feathers and {name2} has no aquarium. Who could own which pet? List every possibility.",
    "Make a rough estimate of {estimate}. State each assumption you make and show the arithmetic.",
    "Find the weakest assumption in this claim and suggest how to check it: \"{argument}\"",
    "{name} says: \"If it rains, the match is cancelled. The match was cancelled, so it rained.\" Is {name} "
    "right? Explain, then give a similar mistaken argument about {topic}.",
    "Every member of a club plays chess or go, and {a} of them play both. If {b} play chess and {c} play go "
    "only, how many members does the club have? Explain your steps.",
    "Suppose {observation}. What further piece of information would most change your view of why, and why?",
]

TEMPLATES["math"] = [
    "Solve for x: {a}x + {b} = {c}. Show each step.",
    "What is {c}% of {a}{b}? Explain how to work it out without a calculator.",
    "{name} buys {c} {item} at ${a} each and hands over {b} ten-dollar notes. How much change is due, or how much "
    "more money is needed?",
    "A rectangle is {a} cm long and {b} cm wide. Find its area, its perimeter and the length of its diagonal.",
    "Find the greatest common divisor and the least common multiple of {a} and {b}, showing your method.",
    "A cyclist covers {a} km in {c} hours. At the same average speed, how long would {b} km take?",
    "What is the sum of all whole numbers from 1 to {a}{c}? Explain a quick way to compute it.",
    "Factor x^2 + {a}x + {b} over the integers, or explain why it cannot be factored.",
    "The average of {c} numbers is {a}. After one more number is included, the average is {b}. What number was "
    "included?",
    "{name} saves ${a} in the first week and ${c} more each week than the week before. How much has {name} "
    "saved after {b} weeks?",
    "A jar has {a} blue beads and {b} white beads. Two beads are taken at random without replacement. What is "
    "the probability that both are blue?",
    "Write {a}{b} in binary and in hexadecimal, and explain the conversion.",
    "A shop lowers the price of {item} by {c}% and then raises the new price by {c}%. If the original price was "
    "${a}, what is the final price, and why is it not the original?",
]

TEMPLATES["coding"] = [
    "Write a {language} function that {task}.",
    "In {language}, how would I write a program that {task}? Include a short explanation of the code.",
    "Explain {code_concept} with a small example in {language}.",
    "Write unit tests in {language} for a function that {task}. Cover the edge cases.",
    "What mistakes do beginners often make with {code_concept} in {language}, and how can they be avoided?",
    "Implement {data_structure} in {language} from scratch, with methods to add, remove and look up items.",
    "Write a small command-line tool in {language} that {task}, reading its input from standard input.",
    "Given the tables customers(id, name, city) and orders(id, customer_id, total, placed_at), write a SQL "
    "query that {query}.",
    "What is the time and space complexity of a straightforward function that {task}? Can it be done faster?",
    "My {language} code that {task} is slow on large inputs. What could I try to speed it up?",
    "When would you choose {data_structure} over {data_structure2}? Give a concrete example in {language}.",
    "Show how to use {code_concept} in {language} to write a function that {task}.",
]

TEMPLATES["extraction"] = [
    "{passage}\n\nExtract {entity} from the text above and present the result as {fmt}.",
    "Read the following text and return {entity} as {fmt}.\n\n{passage}",
    "{passage}\n\nWhat is the overall sentiment of this text: positive, negative, mixed or neutral? Quote the "
    "phrase that best supports your answer.",
    "List every number in this text together with what it refers to, as {fmt}:\n\n{passage}",
    "Text: {passage}\n\nName the people and organisations mentioned, with one line each on their part in it.",
    "Turn the following text into {fmt}, with one entry for each fact it states:\n\n{passage}",
    "Find any dates, deadlines or times in this text and put them in chronological order:\n\n{passage}",
    "From the passage below, extract {entity}. If there are none, say so plainly.\n\n{passage}",
    "Here is a text:\n{passage}\n\nWrite three questions that can be answered from it, each with its answer.",
    "Is the following text a complaint, a request, an announcement, a report or a personal note? Give a "
    "one-line reason.\n\n{passage}",
    "{passage}\n\nWhich statements in this text are facts that could be checked, and which are opinions? "
    "Answer as {fmt}.",
]

TEMPLATES["stem"] = [
    "Explain {concept} in simple terms, then give an everyday example.",
    "What causes {phenomenon}? Explain the science step by step.",
    "How would you explain {concept} to {audience}?",
    "Design a simple, safe experiment a student could do at home to show {concept}.",
    "What are the big open questions in {field} today?",
    "Compare {concept} and {concept2}: how are they related, and how do they differ?",
    "What exactly is going on during {phenomenon}, and how do scientists study it?",
    "Where does {concept} show up in everyday life? Give three examples and explain each.",
    "Give a short history of how scientists came to understand {concept}.",
    "What do people commonly get wrong about {phenomenon}?",
    "What does a career in {field} involve, and what should a secondary-school student study to prepare?",
    "Write five quiz questions, with answers, about {concept} for {audience}.",
]

TEMPLATES["humanities"] = [
    "What were the main causes and consequences of {history}?",
    "Explain the philosophical idea of {idea}, with one argument for it and one against it.",
    "How did {art} change the way people made or thought about art?",
    "Describe daily life for ordinary people in {era}.",
    "How do different countries or communities remember {history}, and why do their accounts differ?",
    "Give an overview of {art}: where it came from, its key features and its lasting influence.",
    "Compare {idea} with {idea2}. Where do they agree and where do they clash?",
    "Suggest three kinds of primary source a student could use to research {history}, and what each might "
    "reveal.",
    "How might {idea} apply to a modern debate about {topic}?",
    "What role did trade, religion and geography play in {era}?",
    "If you could interview someone who lived through {history}, what five questions would you ask, and why?",
    "Why do historians still argue about {history}? Summarise the main positions.",
]

TEMPLATES["general"] = [
    "Give me practical advice on {skill} for a complete beginner.",
    "List ten things to think about before deciding {decision}.",
    "Summarise the following text in two sentences:\n\n{passage}",
    "Rewrite the following text in a {tone} tone for {audience}:\n\n{passage}",
    "Classify each of these as natural or man-made, and explain any that are unclear: {object}, {object2}, "
    "{object3}, {object4}.",
    "What is the difference between {pair}?",
    "Explain {topic} as if I know nothing about it.",
    "Suggest eight creative ideas related to {topic} for {audience}.",
    "Turn this text into a bulleted list of key points:\n\n{passage}",
    "How do I {howto}? Give clear steps.",
    "Make the following text shorter without losing any facts:\n\n{passage}",
    "What are the pros and cons of {topic}? Present them as a table.",
    "Sort these from smallest to largest and say roughly how big each is: {object}, {object2}, {object3}.",
]

# ---- fillers: writing and roleplay ----
FILLERS["topic"] = [
    "remote work", "living in a big city", "keeping bees", "public libraries", "electric scooters",
    "four-day working weeks", "learning a second language", "owning a dog", "community gardens",
    "friendships made online", "fast fashion", "tiny houses", "school uniforms", "car-free town centres",
    "social media for teenagers", "working night shifts", "vegetarian diets", "moving abroad", "self-driving buses",
    "cash-free shops", "minimalism", "board games", "early retirement", "renting instead of buying",
    "video calls with distant family", "competitive sport for children", "camping holidays", "smart home devices",
    "composting", "collecting vinyl records", "volunteering", "open-plan offices", "daylight saving time",
]
FILLERS["person"] = [
    "a retired lighthouse keeper", "a nervous first-year nurse", "a travelling knife sharpener",
    "a twelve-year-old chess prodigy", "a baker who works nights", "an elderly beekeeper",
    "a bus driver on her last shift", "a street musician", "a mapmaker who never leaves home",
    "a sleepy night-shift security guard", "a stubborn goat farmer", "a young archivist",
    "a retired circus acrobat", "a postwoman in a mountain village", "a ferry captain", "an apprentice clockmaker",
    "a chef who has lost his sense of taste", "a substitute teacher", "a hotel night porter",
    "an amateur astronomer", "a shy librarian", "a fisherman's daughter", "a wedding photographer",
    "a long-distance lorry driver", "a botanist on an expedition", "a teenage inventor", "a village doctor",
    "a stage magician past his prime", "a tailor with a secret", "a grandmother who races motorbikes",
    "a detective who hates the rain", "a young king who cannot read",
]
FILLERS["place"] = [
    "a harbour fish auction", "a disused railway station", "a research station in Antarctica", "a crowded ferry",
    "a village bakery before dawn", "a hospital waiting room", "a desert petrol station", "a floating market",
    "a snowed-in mountain hut", "a tiny island with one shop", "an old cinema", "a rooftop garden",
    "a busy airport at midnight", "a second-hand bookshop", "a launderette", "a forest fire lookout tower",
    "a school science lab", "a space station orbiting Mars", "a vineyard at harvest time",
    "a museum after closing time", "a ski resort out of season", "a quiet public library", "a rainy bus stop",
    "an underground train stopped between stations", "a botanical greenhouse", "a traditional tea house",
    "a small-town post office", "a car repair garage", "a farm during lambing season", "a houseboat on a canal",
    "a cathedral bell tower", "a lighthouse on a stormy coast",
]
FILLERS["object"] = [
    "a brass compass", "a smartphone", "a smooth pebble", "a violin", "a folded paper map", "an umbrella",
    "a pair of reading glasses", "a teapot", "a wristwatch", "a bicycle", "a seashell", "a feather", "a candle",
    "a microwave oven", "a wooden chair", "a kite", "a vacuum cleaner", "an apple", "a grand piano",
    "a snow globe", "a typewriter", "a garden hose", "a pinecone", "a coffee mug", "a fountain pen",
    "a chessboard", "a rubber duck", "an electric kettle", "a suitcase", "a bar of soap", "a hot-air balloon",
    "a tennis ball", "a refrigerator", "a loaf of bread", "a bumblebee",
]
FILLERS["form"] = [
    "haiku sequence", "limerick", "sonnet", "free-verse poem", "fable", "diary entry", "short monologue",
    "letter", "newspaper column", "postcard message", "ballad", "radio advert", "fairy tale", "short essay",
    "travel journal entry", "set of song lyrics", "one-page play", "flash fiction piece", "nursery rhyme",
    "social media thread", "pep talk", "short acrostic poem", "poem written as a recipe", "press release",
    "comic strip script", "riddle in verse", "mock obituary", "wedding toast", "museum label", "horoscope",
    "prose poem", "bedtime story",
]
FILLERS["tone"] = [
    "cheerful", "formal", "playful", "solemn", "sarcastic", "gentle", "dramatic", "nostalgic", "hopeful", "warm",
    "dry", "witty", "melancholy", "breathless", "calm", "confident", "curious", "diplomatic", "encouraging",
    "friendly", "grumpy", "humble", "mysterious", "passionate", "poetic", "quirky", "reassuring", "romantic",
    "sceptical", "sincere", "tender", "whimsical", "businesslike", "neutral", "light-hearted",
]
FILLERS["audience"] = [
    "a curious ten-year-old", "a new employee on their first day", "a group of retirees",
    "first-year university students", "a busy small-business owner", "my book club",
    "parents of primary-school children", "a team of software engineers", "a village council",
    "tourists who speak little English", "secondary-school students", "a room full of nurses", "amateur gardeners",
    "members of a hiking club", "people who are wary of technology", "the readers of a local newspaper",
    "a class of seven-year-olds", "a panel of investors", "volunteers at a food bank", "my neighbours",
    "an amateur football team", "art students", "a group of farmers", "apprentice electricians",
    "a group of exchange students", "my grandparents", "a chess club", "readers of a popular science magazine",
    "museum visitors", "a community choir", "new parents", "evening-class students",
]
FILLERS["event"] = [
    "the opening of a new public library", "a change to the bin collection days", "a charity bake sale",
    "the retirement of a long-serving colleague", "a summer street party",
    "the closure of the swimming pool for repairs", "a surprise visit from an inspector", "the first snow of the year",
    "a village talent show", "a power cut planned for next Tuesday", "the launch of a community radio station",
    "the search for a lost cat", "the anniversary of the town's founding", "a new recycling scheme",
    "a marathon passing through the streets", "a flood warning", "the arrival of a travelling circus",
    "a wedding in the town square", "the end of a long strike", "a solar eclipse",
    "the reopening of a restored bridge", "a chess tournament", "a harvest festival",
    "a farewell dinner for a departing teacher", "a Roman coin found in someone's garden", "a new bus route",
    "a school reunion", "a blood donation day", "a fireworks display", "a night for watching a meteor shower",
    "a neighbourhood clean-up day",
]
FILLERS["role"] = [
    "a museum tour guide", "a ship's navigator", "a medieval blacksmith", "a personal fitness coach",
    "a strict but fair piano teacher", "a veteran park ranger", "an airline pilot", "a careers adviser",
    "a travel agent", "a nutritionist", "a pirate captain", "a patient driving instructor",
    "a detective in 1920s Chicago", "a barista who loves philosophy", "a space station engineer",
    "a kindly village doctor", "a chef running a busy kitchen", "a wise old gardener", "a stand-up comedian",
    "a sports commentator", "a financial adviser", "a school librarian", "a zookeeper", "a wedding planner",
    "a language tutor", "a customer service agent for an internet provider", "a master tailor", "an architect",
    "a mountain guide", "a television news presenter", "a film director", "a knight of the round table",
    "a robot butler", "a submarine captain",
]
FILLERS["situation"] = [
    "about to move to a city where I know nobody", "trying to choose between two job offers",
    "planning my first solo camping trip", "nervous about my driving test tomorrow",
    "starting a small bakery business", "learning to swim at forty", "writing my first novel",
    "training for my first half-marathon", "about to give a toast at my sister's wedding",
    "thinking of adopting a rescue dog", "redecorating a tiny flat on a small budget",
    "preparing for a job interview at a bank", "trying to save money for a long trip",
    "struggling to get up early", "organising a family reunion", "returning to study after ten years",
    "buying my first car", "starting to grow vegetables on a balcony", "moving in with a new flatmate",
    "about to lead a team for the first time", "trying to read more books", "planning a surprise party",
    "recovering from a sprained ankle", "building a birdhouse with my children", "learning to cook for myself",
    "visiting a foreign country alone", "trying to calm my nerves before a piano recital",
    "deciding whether to go back to university", "setting up a home aquarium", "opening a small online shop",
    "looking after my neighbour's parrot for a month",
]
FILLERS["era"] = [
    "ancient Rome", "Tang dynasty China", "Victorian London", "the Aztec city of Tenochtitlan", "medieval Baghdad",
    "Edo-period Japan", "the Viking Age in Scandinavia", "ancient Egypt under the pharaohs", "Renaissance Florence",
    "the Mali Empire", "the Inca Empire", "the American Wild West", "Paris in the 1920s", "Elizabethan England",
    "the Ottoman court in Istanbul", "Mughal India", "ancient Athens", "the Byzantine Empire", "the Song dynasty",
    "a Roman frontier fort in Britain", "Venice at the height of its trade", "Moorish Spain",
    "the ports of the Hanseatic League", "Imperial Russia in the 1880s", "the California Gold Rush",
    "the Harlem Renaissance", "the Khmer Empire at Angkor", "the Kingdom of Benin", "the Dutch Golden Age",
    "the caravan towns of the Silk Road", "Great Zimbabwe", "the age of Polynesian voyaging",
]
FILLERS["skill"] = [
    "learning to juggle", "baking sourdough bread", "keeping houseplants alive", "running a first 5K",
    "learning to touch-type", "starting to meditate", "drawing portraits", "learning the guitar",
    "growing tomatoes", "writing a CV", "negotiating a salary", "budgeting on a small income",
    "speaking up in meetings", "learning to swim", "sleeping better", "cooking for a large group",
    "photographing the night sky", "knitting a scarf", "learning a language with little free time",
    "keeping a journal", "basic car maintenance", "making friends in a new city", "revising for exams",
    "managing an overflowing inbox", "brewing coffee at home", "indoor climbing", "mending clothes",
    "birdwatching", "caring for a first pet", "organising a small kitchen", "simple woodworking",
    "calligraphy", "learning chess openings",
]

# ---- fillers: reasoning and math ----
FILLERS["name"] = [
    "Amara", "Bjorn", "Chen", "Dalia", "Emeka", "Farah", "Gustavo", "Hana", "Ivan", "Jorge", "Kiri", "Lena",
    "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sanjay", "Tomas", "Ulla", "Vikram", "Wanjiru",
    "Xavier", "Yara", "Zane", "Aiko", "Bruno", "Camille", "Dmitri", "Esther", "Felix", "Grace", "Hugo",
]
FILLERS["argument"] = [
    "My uncle smoked all his life and lived to ninety, so smoking can't be that harmful.",
    "Crime fell after the new mayor took office, so the mayor must have caused the drop.",
    "Everyone at my gym uses this protein powder, so it must be the best one.",
    "If we let students retake one test, soon they will retake every test and grades will mean nothing.",
    "This restaurant is always full, so the food must be excellent.",
    "These headphones cost three times as much as the others, so they must sound better.",
    "The coin landed heads five times in a row, so tails is due next.",
    "A famous actor recommends this vitamin, so it must work.",
    "Nobody has proved that the old footbridge is unsafe, so it must be safe.",
    "Our team lost every match when I wore my blue scarf, so the scarf brings bad luck.",
    "Many successful founders left university early, so leaving early helps you succeed.",
    "Either we ban cars from the centre or the city will become unliveable.",
    "A survey of our newsletter readers shows that most people love our product.",
    "He is not an accountant, so his point about the budget figures must be wrong.",
    "The town has more doctors than ten years ago and more people are ill, so doctors make people ill.",
    "I read about a dog that bit a child, so all dogs are dangerous.",
    "Sales went up after we changed the logo, so the new logo increased sales.",
    "This remedy has been used for centuries, so it must be effective.",
    "Every student in my group who used flashcards passed, so flashcards guarantee a pass.",
    "My friend's electric car broke down once, so electric cars are unreliable.",
    "If you do not support this plan, you are against the whole company.",
    "The forecast was wrong yesterday, so weather forecasts are useless.",
    "Most people in the village believe it, so it must be true.",
    "Ice cream sales and sunburn cases rise together, so ice cream causes sunburn.",
    "We have already spent so much on this project that we cannot stop now.",
    "The painting was made by a child, so it cannot be good art.",
    "Anyone who truly cared about the environment would never own a car.",
    "The first three customers today complained, so this whole week will go badly.",
    "The new phone is thinner, so its battery must be weaker.",
    "Cheap flights exist, so anyone who says travel is expensive is exaggerating.",
    "I have never met anyone who likes this song, so it cannot have been a hit.",
]
FILLERS["decision"] = [
    "whether to rent or buy a home", "whether to take a gap year", "between a laptop and a desktop for studying",
    "whether to accept a job with a long commute", "whether to repair or replace an old washing machine",
    "whether to learn Spanish or Mandarin", "between a cat and a dog as a first pet",
    "whether to start a business with a friend", "whether to switch careers at thirty-five",
    "whether to move closer to my parents", "between a city break and a beach holiday",
    "whether to buy an electric bicycle", "whether to go freelance", "whether to do a master's degree",
    "whether to change banks", "whether to join a gym or exercise at home",
    "whether to sell my car and rely on public transport", "between a small wedding and a large one",
    "whether to keep a loyal but slow supplier", "whether to upgrade my phone this year",
    "between a cheap flat far from work and a dear one close by",
    "whether to plant a lawn or a wildflower meadow",
    "whether to lend money to a relative", "whether to take a second part-time job",
    "whether to give my teenager a smartphone", "whether to move my small team to a four-day week",
    "whether to study abroad", "between hiring an experienced person and training a junior",
    "whether to renovate the kitchen before selling the house", "whether to buy a used car or lease a new one",
    "whether to move the village festival from summer to autumn",
]
FILLERS["observation"] = [
    "the office plants near the north window wilt faster than those by the south window",
    "a bakery sells more bread on rainy days", "my phone battery drains faster in winter",
    "the queue at the post office is longest on Tuesdays", "the river rises even after a week without rain",
    "students who sit near the front get higher marks", "a website's sign-ups halved overnight",
    "the cat refuses to eat from its new bowl", "bread made from the same recipe rises differently on different days",
    "tomatoes on one side of the garden ripen a week earlier", "complaints at a shop doubled after a new till system",
    "my car uses more fuel on short trips", "the bus is late more often in the morning than in the evening",
    "birds have stopped visiting a garden feeder", "library visits rose after a cafe opened next door",
    "a runner's times got worse after buying new shoes", "milk goes sour faster in one of two fridges",
    "attendance at a school drops every Friday", "the lights in an old house flicker when the kettle is on",
    "a restaurant's takings fall whenever a nearby road is closed", "bug reports spike after each software release",
    "the pond froze on one side only", "the village broadband is slowest around nine in the evening",
    "a dog barks at one particular neighbour and no one else", "a cheaper product outsells a better one",
    "more people cycle to work in spring than in high summer", "the photocopier jams mostly in the afternoon",
    "house prices rose on one street but not on the next", "the fish in an aquarium hide when the television is on",
    "tourists now spend less per day even though they stay longer",
    "a sourdough starter smells different after a holiday",
]
FILLERS["estimate"] = [
    "how many bicycles are parked on a large university campus at noon",
    "how many litres of water a family of four uses in a week", "how many books a town library lends in a year",
    "how many cups of coffee a big city sells before nine in the morning",
    "how many steps a postal worker takes in a day", "how much paper a secondary school uses in a term",
    "how many words a typical person speaks in a day", "how many trees grow in a large city park",
    "how many pizzas are delivered in a city on a Friday night", "how long it would take to walk around the equator",
    "how many grains of rice are in a one-kilogram bag", "how many people are in the air on planes at any moment",
    "how much a household spends a year on electricity for lighting", "how many hairs are on a human head",
    "how many tennis balls would fit in a school bus", "how many phone calls a large hospital receives in a day",
    "how many bricks are in a two-storey house", "how many emails an office of fifty people sends in a week",
    "how many songs a radio station plays in a year", "how much all the apples in a large supermarket weigh",
    "how many bees live in a typical hive in summer", "how many kilometres a city taxi drives in a year",
    "how many letters are printed in a long novel", "how many meals a university canteen serves in a term",
    "how many umbrellas are left on a city's trains in a year", "how many light bulbs are in a large office tower",
    "how many times a heart beats in a lifetime", "how much water a small lawn needs in a dry summer",
    "how many leaves fall from a mature oak each autumn", "how many pianos there are in a city of a million people",
    "how many loaves a busy bakery bakes in a year",
]
FILLERS["item"] = [
    "notebooks", "bags of rice", "pencils", "concert tickets", "flower pots", "loaves of bread", "train tickets",
    "jars of honey", "bus passes", "packs of cards", "candles", "cups of tea", "bottles of juice", "pairs of socks",
    "boxes of tea", "kilograms of apples", "garden chairs", "paintbrushes", "cinema tickets", "sandwiches",
    "tins of paint", "bunches of flowers", "board games", "phone cases", "sketchbooks", "biscuits",
    "water bottles", "scarves", "puzzle books", "tennis balls", "bird feeders", "lunch boxes",
]

# ---- fillers: coding and extraction ----
FILLERS["language"] = [
    "Python", "JavaScript", "TypeScript", "Java", "C", "C++", "C#", "Go", "Rust", "Ruby", "Kotlin", "Swift", "PHP",
    "Scala", "Haskell", "Lua", "R", "Julia", "Bash", "Perl", "Elixir", "Dart", "OCaml", "F#", "Clojure", "Erlang",
    "Zig", "Nim", "Racket", "Fortran", "Common Lisp", "Groovy", "Crystal",
]
FILLERS["task"] = [
    "checks whether a string is a valid IPv4 address", "counts the vowels in a sentence",
    "merges two dictionaries, adding up the values of shared keys",
    "removes duplicate lines from a text file while keeping their order", "converts a Roman numeral to an integer",
    "returns the second largest value in a list", "rotates a square matrix by 90 degrees clockwise",
    "groups words that are anagrams of each other", "reads a CSV file and prints the average of one column",
    "checks whether the brackets in an expression are balanced", "flattens a nested list of any depth",
    "finds every prime below a given limit with a sieve", "validates the format of an email address",
    "compresses a string with run-length encoding", "shuffles a deck of playing cards fairly",
    "works out the weekday of any calendar date", "finds the shortest path through a grid maze",
    "splits a restaurant bill among friends and rounds to the cent",
    "formats a number of seconds as hours, minutes and seconds", "splits a list into chunks of a given size",
    "detects a cycle in a linked list", "generates a random password that meets given rules",
    "reverses the order of words in a sentence but not their letters", "checks whether two rectangles overlap",
    "converts snake_case names to camelCase", "finds the longest word in a sentence",
    "merges overlapping time intervals", "computes compound interest over a number of years",
    "checks whether a filled Sudoku grid is valid", "lists the nodes of a binary tree level by level",
    "strips HTML tags from a string", "computes the check digit of an ISBN-10",
]
FILLERS["code_concept"] = [
    "recursion", "closures", "memoization", "exception handling", "generators", "immutability",
    "dependency injection", "pattern matching", "mocking in unit tests", "string formatting", "regular expressions",
    "higher-order functions", "interfaces or traits", "operator overloading", "lazy evaluation",
    "threads and locks", "async and await", "pointers and references", "integer overflow",
    "floating-point rounding errors", "garbage collection", "type inference", "variable scope", "iterators",
    "enums", "generics", "modules and imports", "reading and writing files", "logging",
    "parsing command-line arguments", "bit manipulation", "Unicode and string encodings",
]
FILLERS["data_structure"] = [
    "a stack", "a queue", "a double-ended queue", "a hash map", "a trie", "a binary search tree", "a min-heap",
    "a circular buffer", "a doubly linked list", "a singly linked list", "an LRU cache", "a Bloom filter",
    "a skip list", "a union-find structure", "a graph stored as an adjacency list",
    "a graph stored as an adjacency matrix", "a sparse matrix", "a priority queue", "a bit set", "a red-black tree",
    "an AVL tree", "a B-tree", "a segment tree", "a Fenwick tree", "a rope for a text editor", "an interval tree",
    "a dynamic array", "a sorted set", "a multimap", "a circular linked list", "a k-d tree", "a quadtree",
    "a hash set",
]
FILLERS["query"] = [
    "lists each city with its number of customers", "finds customers who placed more than three orders in 2023",
    "returns the total spent by each customer, highest first", "finds customers who have never placed an order",
    "shows the average order total for each month", "returns the largest single order in each city",
    "shows the five most recent orders with the customer's name", "counts the orders placed at weekends",
    "lists customers whose first and last orders are more than a year apart",
    "finds the city with the highest total sales",
    "returns customers whose average order is above the overall average",
    "lists orders over 100 placed by customers from a given city", "returns each customer's first order date",
    "ranks customers within each city by total spent", "finds customer names that appear more than once",
    "shows a running total of sales by date", "returns the percentage of orders with a total above 50",
    "lists customers who ordered in every month of 2023",
    "finds customers whose yearly spending fell from one year to the next",
    "counts the distinct customers who ordered in each month", "lists the three biggest spenders in each city",
    "deletes orders whose total is zero", "corrects every city spelled 'Springfeld' to 'Springfield'",
    "finds pairs of orders by the same customer placed within an hour of each other",
    "returns the number of days between each customer's consecutive orders",
    "shows how many customers placed exactly one order", "finds the hour of the day with the most orders",
    "lists cities with fewer than ten customers", "returns the share of total sales that each city contributes",
    "finds the busiest day of the week by number of orders", "lists customers with no orders in the last 90 days",
]
FILLERS["entity"] = [
    "all the names of people", "every date and time", "all place names", "every sum of money",
    "the main complaint", "all action items and who owns them", "every product mentioned", "the key facts",
    "all the questions the writer asks", "every deadline", "the names of any organisations",
    "any measurements with their units", "the main decision that was made", "all the problems mentioned",
    "every requested change", "all the numbers", "each person's stated opinion", "any contact details",
    "every place and what happened there", "the reasons given for each decision", "any risks or worries mentioned",
    "the order in which events happened", "any promises or commitments", "the words used to describe the product",
    "the words that show the writer's mood", "each task and its status",
    "anything that sounds like hearsay rather than fact", "the costs and who pays them",
    "every suggestion for improvement", "all times of day", "the main point of each sentence",
    "the names of any objects or tools",
]
FILLERS["fmt"] = [
    "a JSON object", "a JSON array", "a Markdown table", "a bulleted list", "a numbered list",
    "CSV with a header row", "YAML", "a single sentence", "a two-column table", "plain 'key: value' lines",
    "an XML snippet", "a short paragraph", "one comma-separated line", "a list in alphabetical order",
    "a table with a confidence column", "a JSON list of objects with 'item' and 'detail' keys", "one line per item",
    "a checklist", "a Python dictionary literal", "a TOML table", "an outline with headings",
    "a list grouped by category", "a short memo", "a table ordered by importance",
    "a list in order of first appearance", "a timeline", "tab-separated values", "an HTML list",
    "a list that quotes the text for each item", "a JSON object with counts", "index cards, one per item",
]

# ---- fillers: stem, humanities and general ----
FILLERS["concept"] = [
    "buoyancy", "friction", "inertia", "the Doppler effect", "natural selection", "plate tectonics", "osmosis",
    "the greenhouse effect", "electrical resistance", "the conservation of energy", "radioactive half-life",
    "how vaccines train the immune system", "the water cycle", "acids and bases", "catalysts",
    "the refraction of light",
    "sound waves", "magnetism", "cell division", "the carbon cycle", "entropy", "pressure in fluids",
    "the speed of light", "gravity", "genetic mutation", "food webs", "semiconductors", "probability",
    "exponential growth", "binary numbers", "antibiotic resistance", "nuclear fusion in stars", "erosion",
    "biodiversity", "the pH scale", "heat conduction",
]
FILLERS["phenomenon"] = [
    "auroras", "ocean tides", "rainbows", "thunder and lightning", "the seasons", "earthquakes",
    "volcanic eruptions", "hiccups", "contagious yawning", "red skies at sunset", "static electricity shocks", "fog",
    "hailstorms", "bird migration", "leaves changing colour in autumn", "the phases of the Moon", "jet lag",
    "tsunamis", "solar eclipses", "bread dough rising", "ice floating on water", "goosebumps", "echoes",
    "muscle cramps", "bread going stale", "monsoon rains", "desert mirages", "coral bleaching", "sea breezes",
    "frost patterns on windows", "iron rusting", "clouds forming", "wrinkled fingertips after a long bath",
]
FILLERS["field"] = [
    "marine biology", "materials science", "astronomy", "epidemiology", "geology", "robotics", "cryptography",
    "climate science", "neuroscience", "botany", "organic chemistry", "civil engineering", "oceanography",
    "genetics", "volcanology", "aeronautics", "meteorology", "ecology", "nanotechnology", "statistics",
    "particle physics", "biomedical engineering", "soil science", "computer vision", "acoustics", "palaeontology",
    "pharmacology", "renewable energy engineering", "entomology", "glaciology", "immunology", "number theory",
]
FILLERS["history"] = [
    "the building of the Great Wall", "the printing press in Europe", "the fall of the Western Roman Empire",
    "the Black Death", "the Industrial Revolution in Britain", "the Meiji Restoration", "the French Revolution",
    "the partition of India", "the abolition of the Atlantic slave trade", "the Apollo Moon landings",
    "the voyages of Zheng He", "the fall of the Berlin Wall", "the 1918 influenza pandemic",
    "the building of the Suez Canal", "the Haitian Revolution", "the Protestant Reformation", "the Mongol conquests",
    "the invention of writing in Mesopotamia", "the Irish famine of the 1840s", "the campaign for women's suffrage",
    "the decolonisation of Africa", "the Dust Bowl", "the Columbian exchange", "the Cuban Missile Crisis",
    "the Great Depression", "the founding of the United Nations", "the collapse of the Soviet Union",
    "the Taiping Rebellion", "the sealing of Magna Carta", "the first transatlantic telegraph cable",
    "the Green Revolution in agriculture", "the Norman conquest of England",
]
FILLERS["idea"] = [
    "the social contract", "utilitarianism", "Stoicism", "existentialism", "free will", "the veil of ignorance",
    "moral relativism", "the trolley problem", "the ship of Theseus", "Confucian filial piety",
    "the categorical imperative", "nihilism", "pragmatism", "the problem of evil", "Buddhist impermanence",
    "natural rights", "cultural relativism", "the tragedy of the commons", "Ubuntu philosophy",
    "civil disobedience", "the golden mean", "Occam's razor", "the mind-body problem", "the paradox of tolerance",
    "scepticism about knowledge", "the absurd", "virtue ethics", "the Taoist idea of wu wei", "the harm principle",
    "Plato's allegory of the cave", "determinism", "personal identity over time",
]
FILLERS["art"] = [
    "Impressionism", "Cubism", "Baroque music", "Japanese woodblock printing", "the Gothic novel", "Surrealism",
    "Romantic poetry", "Art Nouveau", "Bauhaus design", "magical realism", "jazz", "the epic poem",
    "Renaissance portrait painting", "Islamic geometric art", "street art and graffiti", "opera", "film noir",
    "Pop Art", "Abstract Expressionism", "the Bengal School of painting", "Aboriginal Australian dot painting",
    "minimalist music", "Dada", "Byzantine mosaics", "haiku", "the realist novel", "Kabuki theatre",
    "Art Deco architecture", "hip-hop", "science fiction literature", "Chinese landscape painting",
    "Mexican muralism", "Brutalist architecture",
]
FILLERS["pair"] = [
    "weather and climate", "a virus and a bacterium", "a comet and an asteroid", "speed and velocity",
    "a crocodile and an alligator", "'affect' and 'effect'", "a loan and a grant", "a republic and a democracy",
    "baking soda and baking powder", "empathy and sympathy", "a hurricane and a typhoon",
    "a credit card and a debit card", "a lake and a pond", "an allergy and an intolerance",
    "a simile and a metaphor", "a frog and a toad", "a fruit and a vegetable", "an ocean and a sea",
    "latitude and longitude", "a patent and a trademark", "mass and weight", "a psychologist and a psychiatrist",
    "jam and jelly", "a rabbit and a hare", "a bug and a missing feature", "memory and storage in a computer",
    "a hill and a mountain", "revenue and profit", "a custom and a law", "skimming and scanning a text",
    "a violin and a viola", "a dialect and a language",
]
FILLERS["howto"] = [
    "remove a coffee stain from a wool jumper", "change a bicycle inner tube", "write a polite complaint to a landlord",
    "set up a monthly budget", "start a compost heap", "back up the photos on my phone",
    "unblock a kitchen sink without chemicals", "prepare for a long-haul flight", "repot a large houseplant",
    "make a simple vegetable stock", "iron a shirt properly", "learn to recognise the brightest stars",
    "teach a dog to come when called", "plan a week of cheap, healthy dinners",
    "hang a heavy mirror on a plaster wall", "keep bread fresh for longer", "pack a suitcase for a two-week trip",
    "sharpen a kitchen knife", "write a thank-you note after an interview", "organise a shared family calendar",
    "clean a cast-iron pan", "take better photos with my phone", "reduce condensation in a bedroom",
    "fold a fitted sheet", "make a good impression in a new job", "look after a sourdough starter",
    "choose a ripe watermelon", "start running without getting injured", "keep track of the books I read",
    "fix a squeaky door", "make my own birthday cards", "store winter clothes over the summer",
]

# ---- passages for extraction, rewriting and summaries (all invented) ----
PASSAGES: list[str] = [
    "I bought the Corvel 2 kettle in March for $48. It boils a full litre in about three minutes and the handle "
    "stays cool, but the lid started sticking after two weeks. Customer support in Leeds replaced it quickly, "
    "so I'd still give it four stars.",
    "The council of Marrowby voted 7 to 2 on Monday to close Fenwick Street to cars on weekends from June 1. "
    "Shop owners are divided: the baker, Ines Polder, expects more foot traffic, while the hardware store fears "
    "losing customers who need to load heavy goods.",
    "Meeting notes, 14 May: Priya will send the revised budget to finance by Friday. Tom raised concerns that "
    "the supplier in Gdansk is two weeks behind schedule. We agreed to postpone the product launch from June 3 "
    "to June 17 and to review progress again next Thursday.",
    "Hi Marcus, thanks for hosting us last weekend; the children still talk about the treehouse. Could you send "
    "me the name of the pizza place you mentioned? We are thinking of coming back in August, if that suits you. "
    "Best wishes, Helen",
    "I have now called your helpline four times about the broken heating in flat 12B, and each time I was "
    "promised an engineer within 48 hours. It has been eleven days and the temperature indoors is 14 degrees. "
    "I expect a visit this week and a partial refund of the service charge.",
    "Please note that the Oakfield swimming pool will close from 2 to 20 September while the changing rooms are "
    "rebuilt. Members can use the Riverside pool at no extra cost during this time. Lessons for children will "
    "resume on 21 September at the usual times.",
    "Day 3 of the trek. We left the hut at 6 am and reached the pass by noon, tired but cheerful. Anna's boots "
    "are giving her blisters, so tomorrow we will take the shorter valley route. The clouds cleared at sunset "
    "and we could see three glaciers at once.",
    "The Lantern Room on Quay Street serves small plates at around $9 each. The grilled squid was tender and "
    "the bread came warm from the oven, but our dessert arrived twenty minutes after we asked for it. Service "
    "was friendly, if stretched, on a busy Saturday night.",
    "Wanted: part-time assistant for a family-run bicycle repair shop in Dunmore. Hours are Tuesday to Saturday, "
    "9 am to 1 pm, paying $18 an hour. Some mechanical experience is useful but we will train the right person. "
    "Apply to Sam Okafor by 30 April.",
    "Lab log, 3 October: sample B was kept at 4 degrees for 72 hours and showed no growth. Sample C, stored at "
    "room temperature, turned cloudy after 20 hours. Dr Hale suspects the seal on C's container was faulty, so "
    "we will repeat both tests with new containers on Monday.",
]
PASSAGES += [
    "Dear parents, the Year 4 trip to the Hollins Farm Museum is on Thursday 12 June. Children should bring a "
    "packed lunch and a raincoat, and the cost is $6, payable at the office by Monday. We still need two parent "
    "volunteers to help on the coach.",
    "Incident report: at 3:40 pm a forklift in aisle 7 clipped a shelf, and four boxes of glassware fell. No one "
    "was hurt. The driver, Luis Mendes, said the aisle lights were out; maintenance confirmed that two bulbs had "
    "failed and replaced them by 5 pm.",
    "The Greyhaven Rovers came back from two goals down to draw 2-2 with Millport on Saturday. Striker Aoife "
    "Brennan scored both goals in the last fifteen minutes. The coach praised the team's spirit but admitted "
    "their defending in the first half was careless.",
    "Bright, two-bedroom flat on the third floor of a converted mill, five minutes' walk from Carden station. "
    "The rent is $1,150 a month, bills not included, and a deposit of one month is required. Pets are allowed "
    "by arrangement; no lift.",
    "Weather update for the coast: strong winds of up to 70 km/h are expected from Tuesday evening until "
    "Wednesday midday. The ferry to Skellan Island may be cancelled, and drivers on the coast road should take "
    "care. Temperatures will stay mild, around 12 degrees.",
    "From next month, staff may work from home on Mondays and Fridays, provided their team lead agrees. Core "
    "hours of 10 am to 3 pm still apply. The new policy will be reviewed after six months using feedback from "
    "a short survey.",
    "In 'The Salt Road', retired sailor Miriam Vos inherits a failing saltworks on a windy estuary. With the help "
    "of a teenage runaway and a grumpy accountant, she tries to save it before the bank forecloses. It is a warm, "
    "funny novel about starting again at seventy.",
    "Hey, running about 20 minutes late, the train stopped outside Harlow for no reason. Can you order for me? "
    "Something vegetarian, no mushrooms. Also, did Kemal say whether he is coming, or should we not wait for him?",
    "Our neighbourhood repair cafe meets on the first Sunday of each month at St Anne's hall, 2 to 5 pm. "
    "Volunteers fixed 31 items last time, from toasters to torn jeans. Entry is free, though donations towards "
    "spare parts are welcome.",
    "Quarterly update: online sales rose 12% compared with last quarter, while shop sales fell 3%. Returns of "
    "the new hiking jacket were unusually high, mostly because of sizing. The team proposes adding a size guide "
    "and a video to the product page.",
]
