"""The Chinese half of the synthetic curriculum: tables (words, facts, number words) and the Chinese
task generators of the pretraining documents.

The English tables and generators live in synthetic.py; these are their Chinese counterparts (the
same task families: arithmetic, counting, spelling, comparison, simple facts), and tasks.py
uses the tables for the Chinese phrasings of the chat tasks. Only common characters, so a small BPE
vocabulary learns them.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from portachat.data.synthetic.common import WORDS, Example

# Words whose characters the curriculum counts: many repeat a character (妈妈, 高高兴兴) so that
# `'妈妈'.count('妈')` answers vary beyond 1.
ZH_WORDS = (
    "妈妈 爸爸 哥哥 姐姐 弟弟 妹妹 爷爷 奶奶 星星 宝宝 谢谢 天天 人人 常常 慢慢 刚刚 "
    "高高兴兴 开开心心 干干净净 明明白白 大大小小 安安静静 清清楚楚 快快乐乐 "
    "一心一意 人山人海 自言自语 不知不觉 十全十美 一模一样 有说有笑 又高又大 "
    "苹果 香蕉 葡萄 西瓜 草莓 橘子 桃子 面包 牛奶 蜂蜜 米饭 面条 蛋糕 饼干 糖果 "
    "桌子 椅子 窗户 房子 花园 大树 河流 高山 大海 森林 白云 太阳 月亮 火车 飞机 "
    "小船 自行车 学校 老师 学生 书本 铅笔 音乐 钢琴 小猫 小狗 兔子 乌龟 猴子 老虎 "
    "大象 熊猫 企鹅 蝴蝶 长颈鹿 小白兔 大熊猫 天安门 好朋友 小朋友 中国人 大学生"
).split()
ZH_OTHER_CHARS = "的一是不人大小天山水子花"  # asked about though absent from the word (answer 0)

CAPITALS_ZH = {
    "法国": "巴黎", "日本": "东京", "意大利": "罗马", "西班牙": "马德里", "德国": "柏林", "埃及": "开罗",
    "加拿大": "渥太华", "俄罗斯": "莫斯科", "中国": "北京", "印度": "新德里", "肯尼亚": "内罗毕",
    "秘鲁": "利马", "希腊": "雅典", "挪威": "奥斯陆", "葡萄牙": "里斯本", "爱尔兰": "都柏林",
    "奥地利": "维也纳", "波兰": "华沙", "墨西哥": "墨西哥城", "阿根廷": "布宜诺斯艾利斯",
    "澳大利亚": "堪培拉", "巴西": "巴西利亚", "瑞典": "斯德哥尔摩", "泰国": "曼谷", "土耳其": "安卡拉",
    "古巴": "哈瓦那", "智利": "圣地亚哥",
}
COLORS_ZH = {
    "晴天的天空": "蓝色", "草": "绿色", "熟透的香蕉": "黄色", "雪": "白色", "煤": "黑色", "熟透的西红柿": "红色",
    "橙子": "橙色", "柠檬": "黄色", "青柠": "绿色", "牛奶": "白色", "乌鸦": "黑色", "草莓": "红色",
    "巧克力": "棕色", "茄子": "紫色", "大海": "蓝色", "南瓜": "橙色", "北极熊": "白色",
}
ANIMAL_SOUNDS_ZH = {
    "牛": "哞哞", "狗": "汪汪", "猫": "喵喵", "鸭子": "嘎嘎", "羊": "咩咩", "青蛙": "呱呱", "蜜蜂": "嗡嗡",
    "老鼠": "吱吱", "公鸡": "喔喔", "小鸟": "叽叽喳喳",
}
DAYS_ZH = ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日")
MONTHS_ZH = ("一月", "二月", "三月", "四月", "五月", "六月", "七月", "八月", "九月", "十月", "十一月", "十二月")
NAMES_ZH = ("小明", "小红", "小华", "小丽", "小刚", "小芳", "小强", "小美", "小军", "小雪", "小文", "小东")
# (measure word, thing): Chinese counts things with a classifier ("5个苹果", "3本书").
THINGS_ZH = (("个", "苹果"), ("本", "书"), ("颗", "弹珠"), ("枚", "硬币"), ("支", "铅笔"), ("张", "贴纸"),
             ("块", "饼干"), ("朵", "花"), ("个", "贝壳"), ("张", "卡片"))

_DIGITS = "零一二三四五六七八九"


def number_to_chinese(n: int) -> str:
    """Chinese numerals for 0 <= n < 100,000 (e.g. 342 -> '三百四十二', 105 -> '一百零五', 15 -> '十五')."""
    if not 0 <= n < 100_000:
        raise ValueError(f"number_to_chinese handles 0..99999, got {n}")
    if n < 10:
        return _DIGITS[n]
    if n < 20:  # 十, 十五: the leading 一 is dropped in speech
        return "十" + ("" if n == 10 else _DIGITS[n - 10])
    out, zero = "", False
    for value, unit in ((10_000, "万"), (1000, "千"), (100, "百"), (10, "十"), (1, "")):
        digit = n // value % 10
        if digit:
            out += ("零" if zero else "") + _DIGITS[digit] + unit
            zero = False
        elif out:
            zero = True  # a gap inside the number is read as one 零 before the next digit
    return out


# ----------------------------------------------------------------------------------------------
# the Chinese task generators of the pretraining curriculum: rng -> Example, mirroring synthetic.py's
# English ones. Where they ask a question the chat curriculum also asks, they use its phrasing, so
# that `heldout.question_key` recognises it and held-out questions stay out of pretraining.


def arithmetic(rng: random.Random) -> Example:
    kind = rng.choice(("add", "sub", "mul", "chain", "words", "story"))
    if kind in ("add", "sub", "mul"):
        if kind == "add":
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            ans, op, word = a + b, "+", "加"
        elif kind == "sub":
            a = rng.randint(0, 99)
            b = rng.randint(0, a)
            ans, op, word = a - b, "-", "减"
        else:
            a, b = rng.randint(0, 12), rng.randint(0, 12)
            ans, op, word = a * b, "*", "乘以"
        q = rng.choice((f"{a}{word}{b}等于多少？", f"{a} {op} {b}等于多少？"))
        return Example("arithmetic", q, str(ans), f"{a}{word}{b}等于{ans}。")
    if kind == "chain":
        a, b, c = rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 9)
        form, ans = rng.choice(
            (("{a} + {b} + {c}", a + b + c), ("{a} + {b} - {c}", a + b - c),
             ("({a} + {b}) * {c}", (a + b) * c), ("{a} * {c} + {b}", a * c + b))
        )
        expr = form.format(a=a, b=b, c=c)
        return Example("arithmetic", f"{expr}等于多少？", str(ans), f"{expr} = {ans}")
    if kind == "words":
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        word = rng.choice(("加", "乘以"))
        ans = a + b if word == "加" else a * b
        expr = f"{number_to_chinese(a)}{word}{number_to_chinese(b)}"
        return Example("arithmetic", f"{expr}等于多少？", number_to_chinese(ans), f"{expr}等于{number_to_chinese(ans)}。")
    name, (mw, thing) = rng.choice(NAMES_ZH), rng.choice(THINGS_ZH)
    a, b = rng.randint(1, 15), rng.randint(1, 15)
    if rng.random() < 0.5:
        ans = a + b
        return Example("arithmetic", f"{name}有{a}{mw}{thing}，又得到了{b}{mw}。{name}现在有几{mw}{thing}？", str(ans),
                       f"{name}原来有{a}{mw}{thing}，又得到了{b}{mw}，现在有{ans}{mw}{thing}。")
    a, b = max(a, b), min(a, b)
    ans = a - b
    return Example("arithmetic", f"{name}有{a}{mw}{thing}，送给别人{b}{mw}。{name}还剩几{mw}{thing}？", str(ans),
                   f"{name}原来有{a}{mw}{thing}，送给别人{b}{mw}，还剩{ans}{mw}{thing}。")


def counting(rng: random.Random) -> Example:
    kind = rng.choice(("letters", "chars", "occurrences", "char_occurrences", "items"))
    if kind == "letters":
        word = rng.choice(WORDS)
        return Example("counting", f"单词{word}有几个字母？", str(len(word)), f"单词{word}有{len(word)}个字母。")
    if kind == "chars":
        word = rng.choice(ZH_WORDS)
        return Example("counting", f"“{word}”这个词有几个字？", str(len(word)), f"“{word}”这个词有{len(word)}个字。")
    if kind == "occurrences":
        word = rng.choice(WORDS)
        letter = rng.choice(word) if rng.random() < 0.8 else rng.choice("abcdefghijklmnopqrstuvwxyz")
        n = word.count(letter)
        return Example("counting", f"{word}里有几个{letter}？", str(n), f"字母{letter}在{word}里出现了{n}次。")
    if kind == "char_occurrences":
        word = rng.choice(ZH_WORDS)
        char = rng.choice(word) if rng.random() < 0.8 else rng.choice(ZH_OTHER_CHARS)
        n = word.count(char)
        return Example("counting", f"“{word}”里有几个“{char}”字？", str(n), f"“{char}”字在“{word}”里出现了{n}次。")
    items = rng.sample(ZH_WORDS, rng.randint(1, 8))
    listing = "、".join(items)
    return Example("counting", f"这些东西一共有几样：{listing}？", str(len(items)), f"{listing}一共有{len(items)}样东西。")


def spelling(rng: random.Random) -> Example:
    word = rng.choice(WORDS)
    kind = rng.choice(("spell", "first", "last", "reverse"))
    if kind == "spell":
        spelled = "-".join(word)
        return Example("spelling", f"{word}怎么拼写？", spelled, f"{word}的拼写是{spelled}。")
    if kind == "first":
        return Example("spelling", f"{word}的第一个字母是什么？", word[0], f"{word}的第一个字母是{word[0]}。")
    if kind == "last":
        return Example("spelling", f"{word}的最后一个字母是什么？", word[-1], f"{word}的最后一个字母是{word[-1]}。")
    return Example("spelling", f"{word}倒过来拼是什么？", word[::-1], f"{word}倒过来拼是{word[::-1]}。")


def comparison(rng: random.Random) -> Example:
    kind = rng.choice(("larger", "smaller", "yesno", "max", "min"))
    if kind in ("larger", "smaller"):
        a, b = rng.sample(range(0, 100), 2)
        ans = max(a, b) if kind == "larger" else min(a, b)
        other = b if ans == a else a
        big = "大" if kind == "larger" else "小"
        return Example("comparison", f"{a}和{b}哪个{big}？", str(ans), f"{ans}比{other}{big}。")
    if kind == "yesno":
        a, b = rng.sample(range(0, 100), 2)
        big = rng.choice("大小")
        truth = a > b if big == "大" else a < b
        stmt = f"{a}比{b}{big}。" if truth else f"{a}不比{b}{big}。"
        return Example("comparison", f"{a}比{b}{big}吗？", "是" if truth else "否", stmt)
    nums = rng.sample(range(0, 100), rng.randint(3, 5))
    listing = "、".join(map(str, nums))
    if kind == "max":
        return Example("comparison", f"{listing}中最大的数是几？", str(max(nums)), f"{listing}中最大的数是{max(nums)}。")
    return Example("comparison", f"{listing}中最小的数是几？", str(min(nums)), f"{listing}中最小的数是{min(nums)}。")


def facts(rng: random.Random) -> Example:
    kind = rng.choice(("capital", "color", "sound", "day_after", "day_before", "month_after"))
    if kind == "capital":
        country, city = rng.choice(sorted(CAPITALS_ZH.items()))
        return Example("facts", f"{country}的首都是哪里？", city, f"{country}的首都是{city}。")
    if kind == "color":
        thing, color = rng.choice(sorted(COLORS_ZH.items()))
        return Example("facts", f"{thing}是什么颜色的？", color, f"{thing}是{color}的。")
    if kind == "sound":
        animal, sound = rng.choice(sorted(ANIMAL_SOUNDS_ZH.items()))
        return Example("facts", f"{animal}怎么叫？", sound, f"{animal}的叫声是{sound}。")
    if kind == "day_after":
        i = rng.randrange(7)
        return Example("facts", f"{DAYS_ZH[i]}的后一天是星期几？", DAYS_ZH[(i + 1) % 7],
                       f"{DAYS_ZH[i]}的后一天是{DAYS_ZH[(i + 1) % 7]}。")
    if kind == "day_before":
        i = rng.randrange(7)
        return Example("facts", f"{DAYS_ZH[i]}的前一天是星期几？", DAYS_ZH[i - 1], f"{DAYS_ZH[i]}的前一天是{DAYS_ZH[i - 1]}。")
    i = rng.randrange(12)
    return Example("facts", f"{MONTHS_ZH[i]}的下一个月是几月？", MONTHS_ZH[(i + 1) % 12],
                   f"{MONTHS_ZH[i]}的下一个月是{MONTHS_ZH[(i + 1) % 12]}。")


TASKS_ZH: dict[str, Callable[[random.Random], Example]] = {
    "arithmetic": arithmetic,
    "counting": counting,
    "spelling": spelling,
    "comparison": comparison,
    "facts": facts,
}

QA_TEMPLATES_ZH = (
    "问题：{q}\n答案：{a}",
    "问：{q}\n答：{a}",
    "{q}{a}。",
    "{q}\n答案：{a}。",
)
