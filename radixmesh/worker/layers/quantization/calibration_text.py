"""The bundled calibration text of `fp8_calibrate`: passages of English, one a sequence.

Two kinds, about 8,600 tokens for SmolLM2's tokenizer in all:
- `ORIGINAL`: twelve paragraphs of everyday prose written for this project (a market town,
  baking, tides, a letter, a short story, instructions, a conversation, ...);
- `PUBLIC_DOMAIN`: 72 well-known passages of public-domain English (the King James
  Bible, Shakespeare, the founding documents of the United States, novels and poems
  published before 1929, addresses of American presidents that are old enough or, as
  works of the US government, were never under copyright), each named in a comment.
  They are quoted from memory, so the wording may differ here and there from any one
  edition; for calibration that does not matter.

Why the well-known passages (docs/quantization.md has the figures): a model predicts a
text it has seen many times far more sharply than new prose, and rounding its weights
moves those predictions most: plain FP8 moves the bundled SmolLM2's next-token
distributions three times as far (KL) on these passages as on the new prose (0.060
against 0.019). Calibrated on the new prose alone, the error compensation left them where
plain FP8 had (0.061); calibrated on both kinds it corrects both, also on passages left
out of the calibration.

None of them is the Gettysburg Address that the quality test and the benchmark score
(tests/worker/model/test_fp8_quality.py, bench/fp8_quality.py): the only words they share
are the Declaration's "that all men are created equal", which that speech quotes. A model
is never measured on what it was calibrated on.
"""

from __future__ import annotations

ORIGINAL: tuple[str, ...] = (
    (
        "The market town sits where two rivers meet, and for as long as anyone can remember "
        "its life has followed the water. In spring the fields along the banks flood, and "
        "the farmers wait for the brown water to go down before they plant. By early summer "
        "the square is full of carts again: onions and cabbages, cheeses wrapped in cloth, "
        "baskets of eggs, bundles of wool. The bridge was rebuilt three times in the last "
        "century, once after a flood and twice after carts grew too heavy for the old stone, "
        "and each new bridge was a little wider than the one before it."
    ),
    (
        "Making bread needs little more than flour, water, salt and time. Mix the flour and "
        "the water until no dry patches remain, then leave the dough alone for half an hour; "
        "the flour soaks up the water and the dough becomes smoother on its own. Add the "
        "salt and the yeast, fold the dough over itself every so often, and let it rise "
        "until it has nearly doubled. Shape it gently, so as not to press out the gas, and "
        "bake it in a very hot oven. A loaf is done when it sounds hollow as you tap the "
        "bottom."
    ),
    (
        "Tides are caused mostly by the moon. Its pull is a little stronger on the side of "
        "the earth that faces it than at the earth's center, and a little weaker on the far "
        "side, so the oceans bulge in two places at once. As the earth turns, a coast passes "
        "through both bulges, which is why most shores see two high tides a day. The sun "
        "adds its own, smaller pull. When the sun and the moon line up, at new moon and full "
        "moon, the tides are largest; when they pull at right angles, the difference between "
        "high and low water is smallest."
    ),
    (
        "Dear Margaret, thank you for your letter, which arrived on Tuesday with the rain. "
        "We are all well here, though the roof over the kitchen has begun to leak again and "
        "your father insists he can mend it himself. The apple tree you planted has more "
        "blossoms this year than ever before. Tom has started school and comes home every "
        "afternoon with a new word he is proud of; yesterday it was 'volcano'. Write soon "
        "and tell us whether you found a room near the library. With love from all of us."
    ),
    (
        "The lighthouse keeper had not seen another person for eleven days when the boat "
        "came around the point. He watched it from the gallery, a small grey shape rising "
        "and falling on the swell, and he wondered whether it meant to land or only to "
        "shelter from the wind. It came closer. A woman in a yellow coat stood at the bow "
        "with a rope in her hands, and when the boat bumped against the jetty she jumped "
        "across without waiting for him. 'You must be Daniel,' she said. 'They sent me with "
        "the lamp oil, and with news you will not like.'"
    ),
    (
        "To change a bicycle tire, first open the brake so the wheel can pass between the "
        "pads, then loosen the axle and lift the wheel out of the frame. Push one side of "
        "the tire off the rim with two levers, pull out the tube and feel carefully around "
        "the inside of the tire for anything sharp; a thorn left there will only puncture "
        "the new tube. Put a little air into the new tube so it holds its shape, tuck it "
        "into the tire, and work the tire back onto the rim with your thumbs. Inflate it, "
        "check that the tire sits evenly all the way around, and put the wheel back."
    ),
    (
        "Some of the oldest known maps were scratched on clay or painted on walls, and they "
        "show more than distance. A map records what its makers cared about: the wells on a "
        "desert route, the safe harbors on a coast, the boundaries of a field that two "
        "families once argued over. Later maps added a grid of lines so that any place could "
        "be named by two numbers. Sailors learned to find their latitude from the height of "
        "the sun at noon, but longitude was much harder, and for centuries ships were lost "
        "because nobody on board knew how far east or west they had come."
    ),
    (
        "'Are you sure this is the right road?' asked Elena, looking at the map upside down. "
        "'Quite sure,' said her brother. 'The sign said twelve miles to the coast, and we "
        "have driven eleven.' 'Then why are we climbing?' 'Because the coast is on the other "
        "side of the hill.' She turned the map around, frowned at it, and said nothing for a "
        "while. When they reached the top, the sea appeared all at once below them, wide and "
        "bright, and she laughed and admitted that he had been right after all."
    ),
    (
        "A healthy garden soil is alive. A single handful holds millions of bacteria, fungi "
        "that spread in fine threads between the roots, tiny insects and worms that drag "
        "fallen leaves underground. They break dead plants down into the nutrients that "
        "living plants take up again. Digging the soil every year breaks up the fungal "
        "threads and brings buried seeds to the light, where they sprout as weeds. Many "
        "gardeners now prefer to leave the soil undisturbed and spread compost on top, "
        "letting the worms do the mixing."
    ),
    (
        "The committee met on Thursday evening to discuss the new library. Three plans were "
        "presented. The first kept the old building and added a reading room at the back; "
        "the second moved the library into the empty school on Mill Street; the third "
        "proposed a new building beside the park. After two hours of discussion, most "
        "members agreed that the school was large enough and cheaper to repair, but several "
        "people asked for more time to study the costs. The committee will vote at its next "
        "meeting, on the first Thursday of next month."
    ),
    (
        "Winter came early that year. The first snow fell in October, before the leaves had "
        "finished falling, and the branches bent and cracked under the weight. The children "
        "were delighted and built a snow fort against the garden wall, with a flag made from "
        "an old shirt. Their grandmother watched them from the window and remembered a "
        "winter long ago when the river froze so hard that people walked across it to the "
        "village on the other side, and a man sold hot chestnuts in the middle of the ice."
    ),
    (
        "Numbers can be written in many ways. The Romans used letters, so that ten was X and "
        "fifty was L, and arithmetic with them was slow. The system we use today, with ten "
        "digits and a place for each power of ten, came to Europe from India by way of "
        "Arabic scholars. Its great advantage is the zero, which holds an empty place: "
        "without it, there would be no way to tell 25 from 205. Computers use the same idea "
        "with only two digits, so that every number becomes a row of ones and zeros."
    ),
)

PUBLIC_DOMAIN: tuple[str, ...] = (
    # The Declaration of Independence (1776)
    (
        "When in the Course of human events, it becomes necessary for one people to dissolve "
        "the political bands which have connected them with another, and to assume among the "
        "powers of the earth, the separate and equal station to which the Laws of Nature and "
        "of Nature's God entitle them, a decent respect to the opinions of mankind requires "
        "that they should declare the causes which impel them to the separation.\n\nWe hold "
        "these truths to be self-evident, that all men are created equal, that they are "
        "endowed by their Creator with certain unalienable Rights, that among these are "
        "Life, Liberty and the pursuit of Happiness. That to secure these rights, "
        "Governments are instituted among Men, deriving their just powers from the consent "
        "of the governed, That whenever any Form of Government becomes destructive of these "
        "ends, it is the Right of the People to alter or to abolish it, and to institute new "
        "Government, laying its foundation on such principles and organizing its powers in "
        "such form, as to them shall seem most likely to effect their Safety and Happiness. "
        "Prudence, indeed, will dictate that Governments long established should not be "
        "changed for light and transient causes; and accordingly all experience hath shewn, "
        "that mankind are more disposed to suffer, while evils are sufferable, than to right "
        "themselves by abolishing the forms to which they are accustomed. But when a long "
        "train of abuses and usurpations, pursuing invariably the same Object evinces a "
        "design to reduce them under absolute Despotism, it is their right, it is their "
        "duty, to throw off such Government, and to provide new Guards for their future "
        "security.\n\nAnd for the support of this Declaration, with a firm reliance on the "
        "protection of divine Providence, we mutually pledge to each other our Lives, our "
        "Fortunes and our sacred Honor."
    ),
    # The Constitution of the United States, Preamble, Article I and the First Amendment
    (
        "We the People of the United States, in Order to form a more perfect Union, "
        "establish Justice, insure domestic Tranquility, provide for the common defence, "
        "promote the general Welfare, and secure the Blessings of Liberty to ourselves and "
        "our Posterity, do ordain and establish this Constitution for the United States of "
        "America.\n\nAll legislative Powers herein granted shall be vested in a Congress of "
        "the United States, which shall consist of a Senate and House of "
        "Representatives.\n\nCongress shall make no law respecting an establishment of "
        "religion, or prohibiting the free exercise thereof; or abridging the freedom of "
        "speech, or of the press; or the right of the people peaceably to assemble, and to "
        "petition the Government for a redress of grievances."
    ),
    # Genesis 1, King James Version (1611)
    (
        "In the beginning God created the heaven and the earth. And the earth was without "
        "form, and void; and darkness was upon the face of the deep. And the Spirit of God "
        "moved upon the face of the waters. And God said, Let there be light: and there was "
        "light. And God saw the light, that it was good: and God divided the light from the "
        "darkness. And God called the light Day, and the darkness he called Night. And the "
        "evening and the morning were the first day. And God said, Let there be a firmament "
        "in the midst of the waters, and let it divide the waters from the waters. And God "
        "made the firmament, and divided the waters which were under the firmament from the "
        "waters which were above the firmament: and it was so. And God called the firmament "
        "Heaven. And the evening and the morning were the second day."
    ),
    # Psalm 23, King James Version
    (
        "The Lord is my shepherd; I shall not want. He maketh me to lie down in green "
        "pastures: he leadeth me beside the still waters. He restoreth my soul: he leadeth "
        "me in the paths of righteousness for his name's sake. Yea, though I walk through "
        "the valley of the shadow of death, I will fear no evil: for thou art with me; thy "
        "rod and thy staff they comfort me. Thou preparest a table before me in the presence "
        "of mine enemies: thou anointest my head with oil; my cup runneth over. Surely "
        "goodness and mercy shall follow me all the days of my life: and I will dwell in the "
        "house of the Lord for ever."
    ),
    # Ecclesiastes 3, King James Version
    (
        "To every thing there is a season, and a time to every purpose under the heaven: A "
        "time to be born, and a time to die; a time to plant, and a time to pluck up that "
        "which is planted; A time to kill, and a time to heal; a time to break down, and a "
        "time to build up; A time to weep, and a time to laugh; a time to mourn, and a time "
        "to dance; A time to cast away stones, and a time to gather stones together; a time "
        "to embrace, and a time to refrain from embracing; A time to get, and a time to "
        "lose; a time to keep, and a time to cast away; A time to rend, and a time to sew; a "
        "time to keep silence, and a time to speak; A time to love, and a time to hate; a "
        "time of war, and a time of peace."
    ),
    # 1 Corinthians 13, King James Version
    (
        "Though I speak with the tongues of men and of angels, and have not charity, I am "
        "become as sounding brass, or a tinkling cymbal. And though I have the gift of "
        "prophecy, and understand all mysteries, and all knowledge; and though I have all "
        "faith, so that I could remove mountains, and have not charity, I am nothing. "
        "Charity suffereth long, and is kind; charity envieth not; charity vaunteth not "
        "itself, is not puffed up. When I was a child, I spake as a child, I understood as a "
        "child, I thought as a child: but when I became a man, I put away childish things. "
        "For now we see through a glass, darkly; but then face to face. And now abideth "
        "faith, hope, charity, these three; but the greatest of these is charity."
    ),
    # Shakespeare, Hamlet
    (
        "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to "
        "suffer\nThe slings and arrows of outrageous fortune,\nOr to take arms against a sea "
        "of troubles\nAnd by opposing end them. To die: to sleep;\nNo more; and by a sleep to "
        "say we end\nThe heart-ache and the thousand natural shocks\nThat flesh is heir to, "
        "'tis a consummation\nDevoutly to be wish'd. To die, to sleep;\nTo sleep: perchance to "
        "dream: ay, there's the rub;\nFor in that sleep of death what dreams may come\nWhen we "
        "have shuffled off this mortal coil,\nMust give us pause: there's the respect\nThat "
        "makes calamity of so long life."
    ),
    # Shakespeare, Macbeth
    (
        "Tomorrow, and tomorrow, and tomorrow,\nCreeps in this petty pace from day to day,\nTo "
        "the last syllable of recorded time;\nAnd all our yesterdays have lighted fools\nThe "
        "way to dusty death. Out, out, brief candle!\nLife's but a walking shadow, a poor "
        "player,\nThat struts and frets his hour upon the stage,\nAnd then is heard no more. "
        "It is a tale\nTold by an idiot, full of sound and fury,\nSignifying nothing."
    ),
    # Shakespeare, Julius Caesar
    (
        "Friends, Romans, countrymen, lend me your ears;\nI come to bury Caesar, not to "
        "praise him.\nThe evil that men do lives after them;\nThe good is oft interred with "
        "their bones;\nSo let it be with Caesar. The noble Brutus\nHath told you Caesar was "
        "ambitious:\nIf it were so, it was a grievous fault,\nAnd grievously hath Caesar "
        "answer'd it."
    ),
    # Shakespeare, As You Like It
    (
        "All the world's a stage,\nAnd all the men and women merely players;\nThey have their "
        "exits and their entrances,\nAnd one man in his time plays many parts,\nHis acts being "
        "seven ages. At first, the infant,\nMewling and puking in the nurse's arms."
    ),
    # Shakespeare, Sonnets 18 and 116
    (
        "Shall I compare thee to a summer's day?\nThou art more lovely and more "
        "temperate:\nRough winds do shake the darling buds of May,\nAnd summer's lease hath "
        "all too short a date;\nSometime too hot the eye of heaven shines,\nAnd often is his "
        "gold complexion dimm'd;\nAnd every fair from fair sometime declines,\nBy chance or "
        "nature's changing course untrimm'd;\nBut thy eternal summer shall not fade,\nNor lose "
        "possession of that fair thou ow'st;\nNor shall Death brag thou wander'st in his "
        "shade,\nWhen in eternal lines to time thou grow'st:\nSo long as men can breathe or "
        "eyes can see,\nSo long lives this, and this gives life to thee.\n\nLet me not to the "
        "marriage of true minds\nAdmit impediments. Love is not love\nWhich alters when it "
        "alteration finds,\nOr bends with the remover to remove.\nO no! it is an ever-fixed "
        "mark\nThat looks on tempests and is never shaken."
    ),
    # Dickens, A Tale of Two Cities (1859)
    (
        "It was the best of times, it was the worst of times, it was the age of wisdom, it "
        "was the age of foolishness, it was the epoch of belief, it was the epoch of "
        "incredulity, it was the season of Light, it was the season of Darkness, it was the "
        "spring of hope, it was the winter of despair, we had everything before us, we had "
        "nothing before us, we were all going direct to Heaven, we were all going direct the "
        "other way -- in short, the period was so far like the present period, that some of "
        "its noisiest authorities insisted on its being received, for good or for evil, in "
        "the superlative degree of comparison only."
    ),
    # Austen, Pride and Prejudice (1813)
    (
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of "
        "such a man may be on his first entering a neighbourhood, this truth is so well "
        "fixed in the minds of the surrounding families, that he is considered the rightful "
        'property of some one or other of their daughters. "My dear Mr. Bennet," said his '
        'lady to him one day, "have you heard that Netherfield Park is let at last?" Mr. '
        'Bennet replied that he had not. "But it is," returned she; "for Mrs. Long has just '
        'been here, and she told me all about it."'
    ),
    # Melville, Moby-Dick (1851)
    (
        "Call me Ishmael. Some years ago -- never mind how long precisely -- having little "
        "or no money in my purse, and nothing particular to interest me on shore, I thought "
        "I would sail about a little and see the watery part of the world. It is a way I "
        "have of driving off the spleen and regulating the circulation. Whenever I find "
        "myself growing grim about the mouth; whenever it is a damp, drizzly November in my "
        "soul; whenever I find myself involuntarily pausing before coffin warehouses, and "
        "bringing up the rear of every funeral I meet; then, I account it high time to get "
        "to sea as soon as I can."
    ),
    # Thoreau, Walden (1854)
    (
        "I went to the woods because I wished to live deliberately, to front only the "
        "essential facts of life, and see if I could not learn what it had to teach, and "
        "not, when I came to die, discover that I had not lived. I did not wish to live what "
        "was not life, living is so dear; nor did I wish to practise resignation, unless it "
        "was quite necessary."
    ),
    # Paine, The American Crisis (1776)
    (
        "These are the times that try men's souls. The summer soldier and the sunshine "
        "patriot will, in this crisis, shrink from the service of their country; but he that "
        "stands by it now, deserves the love and thanks of man and woman. Tyranny, like "
        "hell, is not easily conquered; yet we have this consolation with us, that the "
        "harder the conflict, the more glorious the triumph. What we obtain too cheap, we "
        "esteem too lightly: it is dearness only that gives every thing its value."
    ),
    # Poe, The Raven (1845)
    (
        "Once upon a midnight dreary, while I pondered, weak and weary,\nOver many a quaint "
        "and curious volume of forgotten lore --\nWhile I nodded, nearly napping, suddenly "
        "there came a tapping,\nAs of some one gently rapping, rapping at my chamber "
        'door.\n"\'Tis some visitor," I muttered, "tapping at my chamber door --\nOnly this and '
        'nothing more."'
    ),
    # Wordsworth, I Wandered Lonely as a Cloud (1807)
    (
        "I wandered lonely as a cloud\nThat floats on high o'er vales and hills,\nWhen all at "
        "once I saw a crowd,\nA host, of golden daffodils;\nBeside the lake, beneath the "
        "trees,\nFluttering and dancing in the breeze."
    ),
    # Blake, The Tyger (1794)
    (
        "Tyger Tyger, burning bright,\nIn the forests of the night;\nWhat immortal hand or "
        "eye,\nCould frame thy fearful symmetry?"
    ),
    # Shelley, Ozymandias (1818)
    (
        'I met a traveller from an antique land,\nWho said -- "Two vast and trunkless legs of '
        "stone\nStand in the desert. . . . Near them, on the sand,\nHalf sunk a shattered "
        "visage lies, whose frown,\nAnd wrinkled lip, and sneer of cold command,\nTell that "
        "its sculptor well those passions read\nWhich yet survive, stamped on these lifeless "
        "things,\nThe hand that mocked them, and the heart that fed;\nAnd on the pedestal, "
        "these words appear:\nMy name is Ozymandias, King of Kings;\nLook on my Works, ye "
        "Mighty, and despair!\nNothing beside remains. Round the decay\nOf that colossal "
        'Wreck, boundless and bare\nThe lone and level sands stretch far away."'
    ),
    # Carroll, Alice's Adventures in Wonderland (1865)
    (
        "Alice was beginning to get very tired of sitting by her sister on the bank, and of "
        "having nothing to do: once or twice she had peeped into the book her sister was "
        'reading, but it had no pictures or conversations in it, "and what is the use of a '
        'book," thought Alice "without pictures or conversations?" So she was considering in '
        "her own mind (as well as she could, for the hot day made her feel very sleepy and "
        "stupid), whether the pleasure of making a daisy-chain would be worth the trouble of "
        "getting up and picking the daisies, when suddenly a White Rabbit with pink eyes ran "
        "close by her."
    ),
    # Lazarus, The New Colossus (1883)
    (
        "Not like the brazen giant of Greek fame,\nWith conquering limbs astride from land to "
        "land;\nHere at our sea-washed, sunset gates shall stand\nA mighty woman with a torch. "
        '"Give me your tired, your poor,\nYour huddled masses yearning to breathe free,\nThe '
        "wretched refuse of your teeming shore.\nSend these, the homeless, tempest-tost to "
        'me,\nI lift my lamp beside the golden door!"'
    ),
    # Twain, Adventures of Huckleberry Finn (1884)
    (
        "You don't know about me without you have read a book by the name of The Adventures "
        "of Tom Sawyer; but that ain't no matter. That book was made by Mr. Mark Twain, and "
        "he told the truth, mainly. There was things which he stretched, but mainly he told "
        "the truth."
    ),
    # Shelley, Frankenstein (1818)
    (
        "You will rejoice to hear that no disaster has accompanied the commencement of an "
        "enterprise which you have regarded with such evil forebodings. I arrived here "
        "yesterday, and my first task is to assure my dear sister of my welfare and "
        "increasing confidence in the success of my undertaking."
    ),
    # John 1 and 3:16, King James Version
    (
        "In the beginning was the Word, and the Word was with God, and the Word was God. The "
        "same was in the beginning with God. All things were made by him; and without him "
        "was not any thing made that was made. In him was life; and the life was the light "
        "of men. And the light shineth in darkness; and the darkness comprehended it not. "
        "For God so loved the world, that he gave his only begotten Son, that whosoever "
        "believeth in him should not perish, but have everlasting life."
    ),
    # Matthew 5 and 6, King James Version
    (
        "Blessed are the poor in spirit: for theirs is the kingdom of heaven. Blessed are "
        "they that mourn: for they shall be comforted. Blessed are the meek: for they shall "
        "inherit the earth. Blessed are they which do hunger and thirst after righteousness: "
        "for they shall be filled. Blessed are the merciful: for they shall obtain mercy. "
        "Blessed are the pure in heart: for they shall see God. Blessed are the peacemakers: "
        "for they shall be called the children of God. Our Father which art in heaven, "
        "Hallowed be thy name. Thy kingdom come. Thy will be done in earth, as it is in "
        "heaven. Give us this day our daily bread. And forgive us our debts, as we forgive "
        "our debtors. And lead us not into temptation, but deliver us from evil."
    ),
    # Luke 2, King James Version
    (
        "And it came to pass in those days, that there went out a decree from Caesar "
        "Augustus, that all the world should be taxed. And all went to be taxed, every one "
        "into his own city. And there were in the same country shepherds abiding in the "
        "field, keeping watch over their flock by night. And, lo, the angel of the Lord came "
        "upon them, and the glory of the Lord shone round about them: and they were sore "
        "afraid. And the angel said unto them, Fear not: for, behold, I bring you good "
        "tidings of great joy, which shall be to all people."
    ),
    # Shakespeare, Henry V
    (
        "Once more unto the breach, dear friends, once more;\nOr close the wall up with our "
        "English dead.\nIn peace there's nothing so becomes a man\nAs modest stillness and "
        "humility:\nBut when the blast of war blows in our ears,\nThen imitate the action of "
        "the tiger.\n\nWe few, we happy few, we band of brothers;\nFor he to-day that sheds his "
        "blood with me\nShall be my brother; be he ne'er so vile,\nThis day shall gentle his "
        "condition:\nAnd gentlemen in England now a-bed\nShall think themselves accursed they "
        "were not here."
    ),
    # Shakespeare, The Merchant of Venice
    (
        "The quality of mercy is not strain'd,\nIt droppeth as the gentle rain from "
        "heaven\nUpon the place beneath: it is twice blest;\nIt blesseth him that gives and "
        "him that takes:\n'Tis mightiest in the mightiest: it becomes\nThe throned monarch "
        "better than his crown."
    ),
    # Shakespeare, Romeo and Juliet
    (
        "But, soft! what light through yonder window breaks?\nIt is the east, and Juliet is "
        "the sun.\nO Romeo, Romeo! wherefore art thou Romeo?\nDeny thy father and refuse thy "
        "name;\nOr, if thou wilt not, be but sworn my love,\nAnd I'll no longer be a "
        "Capulet.\nWhat's in a name? that which we call a rose\nBy any other name would smell "
        "as sweet."
    ),
    # Donne, Devotions upon Emergent Occasions (1624)
    (
        "No man is an island, entire of itself; every man is a piece of the continent, a "
        "part of the main. If a clod be washed away by the sea, Europe is the less, as well "
        "as if a promontory were, as well as if a manor of thy friend's or of thine own "
        "were. Any man's death diminishes me, because I am involved in mankind; and "
        "therefore never send to know for whom the bell tolls; it tolls for thee."
    ),
    # Milton, Paradise Lost (1667)
    (
        "Of Man's first disobedience, and the fruit\nOf that forbidden tree whose mortal "
        "taste\nBrought death into the World, and all our woe,\nWith loss of Eden, till one "
        "greater Man\nRestore us, and regain the blissful seat,\nSing, Heavenly Muse."
    ),
    # Patrick Henry, speech to the Virginia Convention (1775)
    (
        "It is in vain, sir, to extenuate the matter. Gentlemen may cry, Peace, Peace -- but "
        "there is no peace. The war is actually begun! The next gale that sweeps from the "
        "north will bring to our ears the clash of resounding arms! Our brethren are already "
        "in the field! Why stand we here idle? What is it that gentlemen wish? What would "
        "they have? Is life so dear, or peace so sweet, as to be purchased at the price of "
        "chains and slavery? Forbid it, Almighty God! I know not what course others may "
        "take; but as for me, give me liberty or give me death!"
    ),
    # Franklin D. Roosevelt, first inaugural address (1933; a work of the US government)
    (
        "This great Nation will endure as it has endured, will revive and will prosper. So, "
        "first of all, let me assert my firm belief that the only thing we have to fear is "
        "fear itself -- nameless, unreasoning, unjustified terror which paralyzes needed "
        "efforts to convert retreat into advance."
    ),
    # John F. Kennedy, inaugural address (1961; a work of the US government)
    (
        "Let the word go forth from this time and place, to friend and foe alike, that the "
        "torch has been passed to a new generation of Americans. Let every nation know, "
        "whether it wishes us well or ill, that we shall pay any price, bear any burden, "
        "meet any hardship, support any friend, oppose any foe, in order to assure the "
        "survival and the success of liberty. And so, my fellow Americans: ask not what your "
        "country can do for you -- ask what you can do for your country."
    ),
    # Washington, Farewell Address (1796)
    (
        "Observe good faith and justice towards all nations; cultivate peace and harmony "
        "with all. Religion and morality enjoin this conduct; and can it be, that good "
        "policy does not equally enjoin it? It is our true policy to steer clear of "
        "permanent alliances with any portion of the foreign world."
    ),
    # The Mayflower Compact (1620)
    (
        "In the name of God, Amen. We, whose names are underwritten, the loyal subjects of "
        "our dread Sovereign Lord King James, having undertaken, for the Glory of God, and "
        "Advancement of the Christian Faith, and the Honour of our King and Country, a "
        "Voyage to plant the first Colony in the northern Parts of Virginia, do by these "
        "Presents, solemnly and mutually, in the Presence of God and one another, covenant "
        "and combine ourselves together into a civil Body Politick."
    ),
    # Emerson, Self-Reliance (1841)
    (
        "To believe your own thought, to believe that what is true for you in your private "
        "heart is true for all men, -- that is genius. Trust thyself: every heart vibrates "
        "to that iron string. A foolish consistency is the hobgoblin of little minds, adored "
        "by little statesmen and philosophers and divines."
    ),
    # Kipling, If- (1910)
    (
        "If you can keep your head when all about you\nAre losing theirs and blaming it on "
        "you,\nIf you can trust yourself when all men doubt you,\nBut make allowance for their "
        "doubting too;\nIf you can wait and not be tired by waiting,\nOr being lied about, "
        "don't deal in lies,\nOr being hated, don't give way to hating,\nAnd yet don't look "
        "too good, nor talk too wise."
    ),
    # Frost, The Road Not Taken (1916)
    (
        "Two roads diverged in a yellow wood,\nAnd sorry I could not travel both\nAnd be one "
        "traveler, long I stood\nAnd looked down one as far as I could\nTo where it bent in "
        "the undergrowth.\n\nI shall be telling this with a sigh\nSomewhere ages and ages "
        "hence:\nTwo roads diverged in a wood, and I --\nI took the one less traveled by,\nAnd "
        "that has made all the difference."
    ),
    # Tennyson, The Charge of the Light Brigade (1854)
    (
        "Half a league, half a league,\nHalf a league onward,\nAll in the valley of Death\nRode "
        'the six hundred.\n"Forward, the Light Brigade!\nCharge for the guns!" he said.\nInto '
        "the valley of Death\nRode the six hundred.\n\nTheirs not to make reply,\nTheirs not to "
        "reason why,\nTheirs but to do and die."
    ),
    # Tennyson, Ulysses (1842)
    (
        "Though much is taken, much abides; and though\nWe are not now that strength which in "
        "old days\nMoved earth and heaven, that which we are, we are;\nOne equal temper of "
        "heroic hearts,\nMade weak by time and fate, but strong in will\nTo strive, to seek, "
        "to find, and not to yield."
    ),
    # Dickinson, "Because I could not stop for Death" and "Hope is the thing with feathers"
    (
        "Because I could not stop for Death --\nHe kindly stopped for me --\nThe Carriage held "
        'but just Ourselves --\nAnd Immortality.\n\n"Hope" is the thing with feathers --\nThat '
        "perches in the soul --\nAnd sings the tune without the words --\nAnd never stops -- "
        "at all --"
    ),
    # Moore, A Visit from St. Nicholas (1823)
    (
        "'Twas the night before Christmas, when all through the house\nNot a creature was "
        "stirring, not even a mouse;\nThe stockings were hung by the chimney with care,\nIn "
        "hopes that St. Nicholas soon would be there."
    ),
    # Dickens, A Christmas Carol (1843)
    (
        "Marley was dead: to begin with. There is no doubt whatever about that. The register "
        "of his burial was signed by the clergyman, the clerk, the undertaker, and the chief "
        "mourner. Scrooge signed it: and Scrooge's name was good upon 'Change, for anything "
        "he chose to put his hand to. Old Marley was as dead as a door-nail."
    ),
    # Tolstoy, Anna Karenina (Garnett's translation, 1901)
    (
        "Happy families are all alike; every unhappy family is unhappy in its own way. "
        "Everything was in confusion in the Oblonskys' house. The wife had discovered that "
        "the husband was carrying on an intrigue with a French girl, who had been a "
        "governess in their family, and she had announced to her husband that she could not "
        "go on living in the same house with him."
    ),
    # Gray, Elegy Written in a Country Churchyard (1751)
    (
        "The curfew tolls the knell of parting day,\nThe lowing herd wind slowly o'er the "
        "lea,\nThe ploughman homeward plods his weary way,\nAnd leaves the world to darkness "
        "and to me."
    ),
    # Keats, Endymion (1818) and Ode on a Grecian Urn (1819)
    (
        "A thing of beauty is a joy for ever:\nIts loveliness increases; it will never\nPass "
        "into nothingness; but still will keep\nA bower quiet for us, and a sleep\nFull of "
        'sweet dreams, and health, and quiet breathing. "Beauty is truth, truth beauty," -- '
        "that is all\nYe know on earth, and all ye need to know."
    ),
    # Bronte, Jane Eyre (1847)
    (
        "There was no possibility of taking a walk that day. We had been wandering, indeed, "
        "in the leafless shrubbery an hour in the morning; but since dinner the cold winter "
        "wind had brought with it clouds so sombre, and a rain so penetrating, that further "
        "out-door exercise was now out of the question. Reader, I married him."
    ),
    # Madison, The Federalist No. 10 (1787)
    (
        "Among the numerous advantages promised by a well-constructed Union, none deserves "
        "to be more accurately developed than its tendency to break and control the violence "
        "of faction. The friend of popular governments never finds himself so much alarmed "
        "for their character and fate, as when he contemplates their propensity to this "
        "dangerous vice."
    ),
    # Aesop, The Hare and the Tortoise (Townsend's translation, 1867)
    (
        "A Hare one day ridiculed the short feet and slow pace of the Tortoise, who replied, "
        'laughing: "Though you be swift as the wind, I will beat you in a race." The Hare, '
        "believing her assertion to be simply impossible, assented to the proposal. On the "
        "day appointed for the race the two started together. The Tortoise never for a "
        "moment stopped, but went on with a slow but steady pace straight to the end of the "
        "course. The Hare, lying down by the wayside, fell fast asleep. At last waking up, "
        "and moving as fast as he could, he saw the Tortoise had reached the goal, and was "
        "comfortably dozing after her fatigue. Slow but steady wins the race."
    ),
    # Isaiah 40, King James Version
    (
        "Hast thou not known? hast thou not heard, that the everlasting God, the Lord, the "
        "Creator of the ends of the earth, fainteth not, neither is weary? He giveth power "
        "to the faint; and to them that have no might he increaseth strength. Even the "
        "youths shall faint and be weary, and the young men shall utterly fall: But they "
        "that wait upon the Lord shall renew their strength; they shall mount up with wings "
        "as eagles; they shall run, and not be weary; and they shall walk, and not faint."
    ),
    # Ruth 1, King James Version
    (
        "And Ruth said, Intreat me not to leave thee, or to return from following after "
        "thee: for whither thou goest, I will go; and where thou lodgest, I will lodge: thy "
        "people shall be my people, and thy God my God: Where thou diest, will I die, and "
        "there will I be buried."
    ),
    # Shakespeare, The Tempest
    (
        "Our revels now are ended. These our actors,\nAs I foretold you, were all spirits "
        "and\nAre melted into air, into thin air:\nAnd, like the baseless fabric of this "
        "vision,\nThe cloud-capp'd towers, the gorgeous palaces,\nThe solemn temples, the "
        "great globe itself,\nYea, all which it inherit, shall dissolve\nAnd, like this "
        "insubstantial pageant faded,\nLeave not a rack behind. We are such stuff\nAs dreams "
        "are made on, and our little life\nIs rounded with a sleep."
    ),
    # Shakespeare, Sonnet 130
    (
        "My mistress' eyes are nothing like the sun;\nCoral is far more red than her lips' "
        "red;\nIf snow be white, why then her breasts are dun;\nIf hairs be wires, black wires "
        "grow on her head."
    ),
    # Doyle, A Scandal in Bohemia (1891)
    (
        "To Sherlock Holmes she is always the woman. I have seldom heard him mention her "
        "under any other name. In his eyes she eclipses and predominates the whole of her "
        "sex. It was not that he felt any emotion akin to love for Irene Adler. All "
        "emotions, and that one particularly, were abhorrent to his cold, precise but "
        "admirably balanced mind. He was, I take it, the most perfect reasoning and "
        "observing machine that the world has seen."
    ),
    # Dickens, Great Expectations (1861)
    (
        "My father's family name being Pirrip, and my Christian name Philip, my infant "
        "tongue could make of both names nothing longer or more explicit than Pip. So, I "
        "called myself Pip, and came to be called Pip."
    ),
    # Stevenson, Treasure Island (1883)
    (
        "Squire Trelawney, Dr. Livesey, and the rest of these gentlemen having asked me to "
        "write down the whole particulars about Treasure Island, from the beginning to the "
        "end, keeping nothing back but the bearings of the island, and that only because "
        "there is still treasure not yet lifted, I take up my pen in the year of grace 17--, "
        "and go back to the time when my father kept the Admiral Benbow inn. Fifteen men on "
        "the dead man's chest -- Yo-ho-ho, and a bottle of rum!"
    ),
    # Stoker, Dracula (1897)
    (
        "Left Munich at 8:35 P.M., on 1st May, arriving at Vienna early next morning; should "
        "have arrived at 6:46, but train was an hour late. Buda-Pesth seems a wonderful "
        "place, from the glimpse which I got of it from the train and the little I could "
        "walk through the streets."
    ),
    # Poe, The Tell-Tale Heart (1843)
    (
        "True! -- nervous -- very, very dreadfully nervous I had been and am; but why will "
        "you say that I am mad? The disease had sharpened my senses -- not destroyed -- not "
        "dulled them. Above all was the sense of hearing acute. I heard all things in the "
        "heaven and in the earth. I heard many things in hell. How, then, am I mad? Hearken! "
        "and observe how healthily -- how calmly I can tell you the whole story."
    ),
    # Swift, Gulliver's Travels (1726)
    (
        "My father had a small estate in Nottinghamshire; I was the third of five sons. He "
        "sent me to Emanuel College in Cambridge at fourteen years old, where I resided "
        "three years, and applied myself close to my studies."
    ),
    # Twain, The Adventures of Tom Sawyer (1876)
    (
        "Tom appeared on the sidewalk with a bucket of whitewash and a long-handled brush. "
        "He surveyed the fence, and all gladness left him and a deep melancholy settled down "
        "upon his spirit. Thirty yards of board fence nine feet high. Life to him seemed "
        "hollow, and existence but a burden."
    ),
    # London, The Call of the Wild (1903)
    (
        "Buck did not read the newspapers, or he would have known that trouble was brewing, "
        "not alone for himself, but for every tide-water dog, strong of muscle and with "
        "warm, long hair, from Puget Sound to San Diego."
    ),
    # Magna Carta (1215), clauses 39 and 40, in translation
    (
        "No free man shall be seized or imprisoned, or stripped of his rights or "
        "possessions, or outlawed or exiled, or deprived of his standing in any other way, "
        "nor will we proceed with force against him, or send others to do so, except by the "
        "lawful judgement of his equals or by the law of the land. To no one will we sell, "
        "to no one deny or delay right or justice."
    ),
    # The Second, Fourth and Sixth Amendments to the US Constitution (1791)
    (
        "A well regulated Militia, being necessary to the security of a free State, the "
        "right of the people to keep and bear Arms, shall not be infringed. The right of the "
        "people to be secure in their persons, houses, papers, and effects, against "
        "unreasonable searches and seizures, shall not be violated, and no Warrants shall "
        "issue, but upon probable cause, supported by Oath or affirmation, and particularly "
        "describing the place to be searched, and the persons or things to be seized. In all "
        "criminal prosecutions, the accused shall enjoy the right to a speedy and public "
        "trial, by an impartial jury of the State and district wherein the crime shall have "
        "been committed."
    ),
    # The Declaration of Independence, the grievances
    (
        "The history of the present King of Great Britain is a history of repeated injuries "
        "and usurpations, all having in direct object the establishment of an absolute "
        "Tyranny over these States. To prove this, let Facts be submitted to a candid world. "
        "He has refused his Assent to Laws, the most wholesome and necessary for the public "
        "good. He has forbidden his Governors to pass Laws of immediate and pressing "
        "importance, unless suspended in their operation till his Assent should be obtained; "
        "and when so suspended, he has utterly neglected to attend to them."
    ),
    # Jefferson, first inaugural address (1801)
    (
        "Let us, then, fellow-citizens, unite with one heart and one mind. Let us restore to "
        "social intercourse that harmony and affection without which liberty and even life "
        "itself are but dreary things. Every difference of opinion is not a difference of "
        "principle. We have called by different names brethren of the same principle. We are "
        "all Republicans, we are all Federalists."
    ),
    # Burns, Auld Lang Syne (1788)
    (
        "Should auld acquaintance be forgot,\nAnd never brought to mind?\nShould auld "
        "acquaintance be forgot,\nAnd auld lang syne!\n\nFor auld lang syne, my dear,\nFor auld "
        "lang syne.\nWe'll tak a cup o' kindness yet,\nFor auld lang syne."
    ),
    # Grimm, Hansel and Gretel (Hunt's translation, 1884)
    (
        "Hard by a great forest dwelt a poor wood-cutter with his wife and his two children. "
        "The boy was called Hansel and the girl Gretel. He had little to bite and to break, "
        "and once when great dearth fell on the land, he could no longer procure even daily "
        "bread. Now when he thought over this by night in his bed, and tossed about in his "
        'anxiety, he groaned and said to his wife, "What is to become of us? How are we to '
        'feed our poor children, when we no longer have anything even for ourselves?"'
    ),
    # Taylor, The Star (1806), and Hale, Mary's Lamb (1830)
    (
        "Twinkle, twinkle, little star,\nHow I wonder what you are!\nUp above the world so "
        "high,\nLike a diamond in the sky.\n\nMary had a little lamb,\nIts fleece was white as "
        "snow;\nAnd everywhere that Mary went\nThe lamb was sure to go."
    ),
    # Poe, The Raven
    (
        'Quoth the Raven "Nevermore." And the Raven, never flitting, still is sitting, still '
        "is sitting\nOn the pallid bust of Pallas just above my chamber door;\nAnd his eyes "
        "have all the seeming of a demon's that is dreaming,\nAnd the lamp-light o'er him "
        "streaming throws his shadow on the floor."
    ),
    # Longfellow, The Building of the Ship (1849)
    (
        "Sail on, O Ship of State!\nSail on, O Union, strong and great!\nHumanity with all its "
        "fears,\nWith all the hopes of future years,\nIs hanging breathless on thy fate!"
    ),
)

# The default calibration passages: every one, each its own sequence.
PASSAGES: tuple[str, ...] = ORIGINAL + PUBLIC_DOMAIN
